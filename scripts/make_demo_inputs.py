"""Writes the inputs of a small X1-style extraction (shared/notes/workloads.md) into a directory:

  tokens.npy           Zipf(1.1)-distributed token ids (uint16), `--sequences` x 128
  sae/cfg.json         SAELens-style config of a TopK SAE (d_in 256, d_sae 4096, k 32)
  sae/sae_weights.safetensors   W_enc, b_enc, W_dec, b_dec; unit-norm decoder rows, W_enc = W_dec^T
  vocab.json           a made-up vocabulary in GPT-2's byte-level form ("\u0120" for a leading
                       space), so that `latentctl latent --vocab` shows text instead of ids

    /usr/bin/python3 scripts/make_demo_inputs.py OUT_DIR [--sequences N] [--seed S]

Only numpy is needed; safetensors is written by hand (8-byte little-endian header length, JSON
header, raw little-endian data).
"""

import argparse
import json
import os
import struct

import numpy as np


def write_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name, array in tensors.items():
        data = np.ascontiguousarray(array, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)  # keep the data 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def made_up_vocab(size):
    """A few common words for the commonest (Zipf: lowest) ids, then syllable pairs; most tokens
    start a word (byte-level BPE's "\u0120" prefix), every fifth continues one."""
    common = ["\u0120the", ",", "\u0120of", "\u0120and", ".", "\u0120to", "\u0120a", "\u0120in",
              "\u010a", "\u0120is", "\u0120that", "\u0120for", "\u0120it", "'s", "\u0120was"]
    syllables = [c + v for c in "bdfghklmnprstvz" for v in "aeiou"]
    words = list(common)
    i = 0
    while len(words) < size:
        word = syllables[i % len(syllables)] + syllables[(i // len(syllables)) % len(syllables)]
        words.append(word if i % 5 == 4 else "\u0120" + word)
        i += 1
    return {word: token for token, word in enumerate(words[:size])}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--sequences", type=int, default=64)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--d_in", type=int, default=256)
    parser.add_argument("--d_sae", type=int, default=4096)
    parser.add_argument("--k", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    os.makedirs(os.path.join(args.out, "sae"), exist_ok=True)

    n = args.sequences * args.context
    tokens = rng.zipf(1.1, size=n)
    tokens = np.where(tokens >= args.vocab, rng.integers(0, args.vocab, size=n), tokens - 1)
    np.save(os.path.join(args.out, "tokens.npy"), tokens.astype(np.uint16))

    w_dec = rng.standard_normal((args.d_sae, args.d_in)).astype(np.float32)
    w_dec /= np.linalg.norm(w_dec, axis=1, keepdims=True)
    write_safetensors(os.path.join(args.out, "sae", "sae_weights.safetensors"), {
        "W_enc": w_dec.T.copy(),
        "b_enc": np.zeros(args.d_sae, np.float32),
        "W_dec": w_dec,
        "b_dec": np.zeros(args.d_in, np.float32),
    })
    with open(os.path.join(args.out, "sae", "cfg.json"), "w") as f:
        json.dump({"architecture": "topk", "d_in": args.d_in, "d_sae": args.d_sae, "k": args.k,
                   "hook_name": "blocks.2.hook_resid_post", "apply_b_dec_to_input": True,
                   "dtype": "float32", "model_name": "latentd-reference"}, f, indent=1)
    with open(os.path.join(args.out, "vocab.json"), "w") as f:
        json.dump(made_up_vocab(args.vocab), f)
    print("wrote %s: %d tokens, SAE %dx%d k=%d" % (args.out, n, args.d_in, args.d_sae, args.k))


if __name__ == "__main__":
    main()
