"""EXTRACT from a Hugging Face GPT-2 checkpoint read natively against the route users had before
it, the same model exported to TorchScript, side by side in one run (alternating, best of
--repeats for each), both through engine/extract_tool (the whole job: load, forward, store).

The checkpoint has GPT-2 small's shape (d_model 768, 12 layers, 12 heads, vocab 50257, 1024
positions) with random N(0, 0.02) weights; the TorchScript module computes the same forward and
returns every hidden state (what a traced Hugging Face model with output_hidden_states gives).
The hook is the middle of the stack (blocks.5.hook_resid_post = hidden_states.6): the native
model stops after block 5, the TorchScript one runs all 12. Also checks that both stored the
same rows.

    bazel build -c opt //engine:extract_tool
    /usr/bin/python3 bench/hf_native_bench.py [--sequences 32] [--context 128] [--repeats 2]
"""
import argparse
import json
import math
import os
import struct
import sys
import tempfile

import numpy as np
import torch

from extract_tool_run import run_dense

D, LAYERS, HEADS, VOCAB, POSITIONS = 768, 12, 12, 50257, 1024


def write_safetensors(path, tensors):
    header, offset = {}, 0
    for name, t in tensors.items():
        n = t.numel() * 4
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + n]}
        offset += n
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for t in tensors.values():
            f.write(t.contiguous().numpy().tobytes())


class Block(torch.nn.Module):
    def __init__(self, w, l):
        super().__init__()
        p = "h.%d." % l
        get = lambda n: torch.nn.Parameter(w[p + n])
        self.ln1_w, self.ln1_b = get("ln_1.weight"), get("ln_1.bias")
        self.w_qkv, self.b_qkv = get("attn.c_attn.weight"), get("attn.c_attn.bias")
        self.w_o, self.b_o = get("attn.c_proj.weight"), get("attn.c_proj.bias")
        self.ln2_w, self.ln2_b = get("ln_2.weight"), get("ln_2.bias")
        self.w_in, self.b_in = get("mlp.c_fc.weight"), get("mlp.c_fc.bias")
        self.w_out, self.b_out = get("mlp.c_proj.weight"), get("mlp.c_proj.bias")
        self.d, self.heads = D, HEADS

    def forward(self, x: torch.Tensor, mask: torch.Tensor):
        B, S, d, H = x.shape[0], x.shape[1], self.d, self.heads
        dh = d // H
        h = torch.nn.functional.layer_norm(x, [d], self.ln1_w, self.ln1_b, 1e-5)
        qkv = (h @ self.w_qkv + self.b_qkv).view(B, S, 3, H, dh)
        q, k, v = qkv[:, :, 0].transpose(1, 2), qkv[:, :, 1].transpose(1, 2), qkv[:, :, 2].transpose(1, 2)
        att = (q @ k.transpose(-1, -2) / math.sqrt(dh)).masked_fill(mask, float("-inf")).softmax(-1)
        x = x + (att @ v).transpose(1, 2).reshape(B, S, d) @ self.w_o + self.b_o
        h2 = torch.nn.functional.layer_norm(x, [d], self.ln2_w, self.ln2_b, 1e-5)
        return x + torch.nn.functional.gelu(h2 @ self.w_in + self.b_in, approximate="tanh") @ self.w_out + self.b_out


class Gpt2HiddenStates(torch.nn.Module):
    """GPT-2's forward from Hugging Face-named weights, returning every hidden state."""

    def __init__(self, w):
        super().__init__()
        self.wte = torch.nn.Parameter(w["wte.weight"])
        self.wpe = torch.nn.Parameter(w["wpe.weight"])
        self.blocks = torch.nn.ModuleList([Block(w, l) for l in range(LAYERS)])

    def forward(self, ids: torch.Tensor):
        S = ids.shape[1]
        x = self.wte[ids] + self.wpe[:S]
        hidden = [x]
        mask = torch.ones(S, S, dtype=torch.bool).triu(1)
        for block in self.blocks:
            x = block(x, mask)
            hidden.append(x)
        return hidden


def weights():
    g = torch.Generator().manual_seed(0)
    n = lambda *shape: torch.randn(*shape, generator=g) * 0.02
    w = {"wte.weight": n(VOCAB, D), "wpe.weight": n(POSITIONS, D)}
    for l in range(LAYERS):
        p = "h.%d." % l
        w.update({p + "ln_1.weight": torch.ones(D), p + "ln_1.bias": torch.zeros(D),
                  p + "attn.c_attn.weight": n(D, 3 * D), p + "attn.c_attn.bias": torch.zeros(3 * D),
                  p + "attn.c_proj.weight": n(D, D), p + "attn.c_proj.bias": torch.zeros(D),
                  p + "ln_2.weight": torch.ones(D), p + "ln_2.bias": torch.zeros(D),
                  p + "mlp.c_fc.weight": n(D, 4 * D), p + "mlp.c_fc.bias": torch.zeros(4 * D),
                  p + "mlp.c_proj.weight": n(4 * D, D), p + "mlp.c_proj.bias": torch.zeros(D)})
    return w


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sequences", type=int, default=32)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--tool", default="bazel-bin/engine/extract_tool")
    args = ap.parse_args()
    torch.set_num_threads(os.cpu_count())
    root = tempfile.mkdtemp(prefix="hf-native-bench-")
    w = weights()
    os.makedirs(os.path.join(root, "gpt2"))
    with open(os.path.join(root, "gpt2", "config.json"), "w") as f:
        json.dump({"model_type": "gpt2", "n_embd": D, "n_layer": LAYERS, "n_head": HEADS,
                   "vocab_size": VOCAB, "n_positions": POSITIONS}, f)
    write_safetensors(os.path.join(root, "gpt2", "model.safetensors"), w)
    torch.jit.script(Gpt2HiddenStates(w).eval()).save(os.path.join(root, "gpt2.pt"))
    ids = np.random.default_rng(0).integers(0, VOCAB, args.sequences * args.context).astype(np.uint16)
    np.save(os.path.join(root, "tokens.npy"), ids)
    tokens = args.sequences * args.context

    native = {"huggingface": {"path": os.path.join(root, "gpt2")}}
    script = {"torchscript": {"path": os.path.join(root, "gpt2.pt"), "vocabSize": VOCAB}}
    best = {"native": float("inf"), "torchscript": float("inf")}
    rows = {}
    for _ in range(args.repeats):
        for tag, model, hook in [("native", native, "blocks.5.hook_resid_post"),
                                 ("torchscript", script, "hidden_states.6")]:
            wall, _, rows[tag] = run_dense(args.tool, root, model, hook, args.context, tag)
            best[tag] = min(best[tag], wall)
    err = np.abs(rows["native"] - rows["torchscript"]).max() / np.abs(rows["torchscript"]).max()
    print("GPT-2 small shape, %d tokens (%d x %d), hook blocks.5.hook_resid_post, best of %d, %d cores"
          % (tokens, args.sequences, args.context, args.repeats, os.cpu_count()))
    print("| route | job wall (s) | tokens/s |")
    print("| --- | --- | --- |")
    for tag in ["native", "torchscript"]:
        print("| %s | %.2f | %.0f |" % (tag, best[tag], tokens / best[tag]))
    print("native / torchscript wall: %.2f; stored rows agree within %.1e of the largest value"
          % (best["native"] / best["torchscript"], err))
    if err > 1e-4:
        sys.exit("the two routes stored different rows")


if __name__ == "__main__":
    main()
