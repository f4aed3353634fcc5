"""EXTRACT from a Llama-architecture Hugging Face checkpoint in float32 against bfloat16
(`"model": {"huggingface": {"dtype": "BFLOAT16"}}`), side by side in one run (alternating, best
of --repeats each), both through engine/extract_tool (the whole job: read the weights, forward,
store): wall time, tokens/s, the process's peak RSS, and how far the bfloat16 rows are from the
float32 ones.

The checkpoint has a small Llama's shape (d_model 1024, 8 layers, 16 heads, 4 key/value heads,
intermediate 2816, vocab 32000: 160M parameters, 0.64 GB in float32) with random weights, stored
as BF16 as the Hub ships Llama checkpoints. The hook is blocks.5.hook_resid_post.

    bazel build -c opt //engine:extract_tool
    /usr/bin/python3 bench/hf_dtype_bench.py [--sequences 32] [--context 256] [--repeats 2]
"""
import argparse
import json
import os
import struct
import tempfile

import numpy as np
import torch

from extract_tool_run import run_dense

D, LAYERS, HEADS, KV, FF, VOCAB = 1024, 8, 16, 4, 2816, 32000


def write_bf16_checkpoint(directory):
    os.makedirs(directory, exist_ok=True)
    torch.manual_seed(0)
    dh = D // HEADS
    shapes = {"model.embed_tokens.weight": (VOCAB, D), "lm_head.weight": (VOCAB, D),
              "model.norm.weight": (D,)}
    for l in range(LAYERS):
        p = "model.layers.%d." % l
        shapes.update({p + "input_layernorm.weight": (D,), p + "post_attention_layernorm.weight": (D,),
                       p + "self_attn.q_proj.weight": (HEADS * dh, D), p + "self_attn.k_proj.weight": (KV * dh, D),
                       p + "self_attn.v_proj.weight": (KV * dh, D), p + "self_attn.o_proj.weight": (D, HEADS * dh),
                       p + "mlp.gate_proj.weight": (FF, D), p + "mlp.up_proj.weight": (FF, D),
                       p + "mlp.down_proj.weight": (D, FF)})
    header, offset, blobs = {}, 0, []
    for name, shape in shapes.items():
        t = 1 + 0.1 * torch.randn(shape) if name.endswith("norm.weight") else 0.02 * torch.randn(shape)
        raw = t.to(torch.bfloat16).view(torch.int16).numpy().tobytes()
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(os.path.join(directory, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump({"model_type": "llama", "hidden_size": D, "num_hidden_layers": LAYERS,
                   "num_attention_heads": HEADS, "num_key_value_heads": KV, "intermediate_size": FF,
                   "vocab_size": VOCAB, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
                   "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}, f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sequences", type=int, default=32)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--tool", default="bazel-bin/engine/extract_tool")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="hf-dtype-bench-")
    rng = np.random.default_rng(0)
    n = args.sequences * args.context
    np.save(os.path.join(root, "tokens.npy"), rng.integers(0, VOCAB, size=n).astype(np.uint16))
    model_dir = os.path.join(root, "llama")
    write_bf16_checkpoint(model_dir)
    best = {}
    for _ in range(args.repeats):
        for dtype in ("FLOAT32", "BFLOAT16"):
            model = {"huggingface": {"path": model_dir, "dtype": dtype}}
            wall, rss, rows = run_dense(args.tool, root, model, "blocks.5.hook_resid_post",
                                        args.context, dtype)
            if dtype not in best or wall < best[dtype][0]:
                best[dtype] = (wall, rss, rows)
    f32, b16 = best["FLOAT32"], best["BFLOAT16"]
    err = np.abs(b16[2] - f32[2]).max() / np.abs(f32[2]).max()
    print("%d tokens (%d x %d), hook blocks.5.hook_resid_post, best of %d" %
          (n, args.sequences, args.context, args.repeats))
    print("%-9s %-9s %-11s %-13s" % ("DTYPE", "WALL", "TOKENS/S", "PEAK RSS"))
    for name, (wall, rss, _) in (("float32", f32), ("bfloat16", b16)):
        print("%-9s %-9s %-11.0f %-13s" % (name, "%.2f s" % wall, n / wall, "%.2f GB" % (rss / 1e9)))
    print("bfloat16 / float32: wall %.2fx, peak RSS %.2fx; largest difference %.2g of the largest value"
          % (b16[0] / f32[0], b16[1] / f32[1], err))


if __name__ == "__main__":
    main()
