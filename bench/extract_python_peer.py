"""The Python extraction pipeline a user would write for X1 (bench/extract_bench.cc runs it).

python3-torch: the same reference transformer (weights read from the bench's
reference.safetensors), a forward hook capturing blocks.2 output with the forward stopped after
block 2, SAE TopK (topk then ReLU), and scipy.sparse.save_npz of each 16384-row chunk (CSR, fp16
values, token ids in a separate .npy), which is what users do to stream results to disk.
Prints "tokens_per_second <x>".
"""
import argparse
import json
import math
import os
import struct
import time

import numpy as np
import scipy.sparse
import torch

CTX, LAYER, K, CHUNK_ROWS, BATCH = 128, 2, 32, 16384, 32


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, t = e["data_offsets"]
        assert e["dtype"] == "F32"
        out[name] = torch.from_numpy(np.frombuffer(data[b:t], dtype=np.float32).copy()).view(e["shape"])
    return out


class Block(torch.nn.Module):
    def __init__(self, w, p, heads):
        super().__init__()
        self.w = {k[len(p):]: v for k, v in w.items() if k.startswith(p)}
        self.heads = heads

    def forward(self, x):
        w, (B, S, d) = self.w, x.shape
        H, dh = self.heads, x.shape[-1] // self.heads
        h = torch.nn.functional.layer_norm(x, (d,), w["ln1.w"], w["ln1.b"], 1e-5)
        qkv = (h @ w["attn.W_qkv"] + w["attn.b_qkv"]).view(B, S, 3, H, dh)
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(dh)
        att = att.masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
        x = x + (att @ v).transpose(1, 2).reshape(B, S, d) @ w["attn.W_O"] + w["attn.b_O"]
        h2 = torch.nn.functional.layer_norm(x, (d,), w["ln2.w"], w["ln2.b"], 1e-5)
        mlp = torch.nn.functional.gelu(h2 @ w["mlp.W_in"] + w["mlp.b_in"], approximate="tanh")
        return x + mlp @ w["mlp.W_out"] + w["mlp.b_out"]


class StopForward(Exception):
    pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    os.makedirs(a.out, exist_ok=True)
    w = read_safetensors(os.path.join(a.dir, "reference.safetensors"))
    sae = read_safetensors(os.path.join(a.dir, "sae", "sae_weights.safetensors"))
    n_layers = 1 + max(int(k.split(".")[1]) for k in w if k.startswith("blocks."))
    blocks = torch.nn.ModuleList([Block(w, "blocks.%d." % l, 4) for l in range(n_layers)])
    captured = {}

    def hook(module, inputs, output):
        captured["x"] = output
        raise StopForward()  # stop the forward after the hooked block

    blocks[LAYER].register_forward_hook(hook)
    tokens = np.fromfile(os.path.join(a.dir, "tokens.bin"), dtype=np.uint16)
    n_seq = len(tokens) // CTX
    tokens = torch.from_numpy(tokens[: n_seq * CTX].astype(np.int64)).view(n_seq, CTX)
    rows, vals, idxs, toks, chunk = [], [], [], [], 0
    start = time.perf_counter()

    def flush():
        nonlocal rows, vals, idxs, toks, chunk
        if not vals:
            return
        v = np.concatenate(vals)
        i = np.concatenate(idxs)
        n = len(v)
        keep = v.reshape(-1) != 0
        counts = keep.reshape(n, K).sum(1)
        indptr = np.concatenate([[0], np.cumsum(counts)])
        m = scipy.sparse.csr_matrix((v.reshape(-1)[keep].astype(np.float16), i.reshape(-1)[keep], indptr),
                                    shape=(n, sae["W_enc"].shape[1]))
        scipy.sparse.save_npz(os.path.join(a.out, "chunk%05d.npz" % chunk), m)
        np.save(os.path.join(a.out, "tokens%05d.npy" % chunk), np.concatenate(toks).astype(np.int32))
        chunk += 1
        vals, idxs, toks = [], [], []

    pending = 0
    with torch.inference_mode():
        for s in range(0, n_seq, BATCH):
            t = tokens[s:s + BATCH]
            x = w["embed.W_E"][t] + w["embed.W_pos"][: t.shape[1]]
            try:
                for b in blocks:
                    x = b(x)
            except StopForward:
                pass
            h = captured["x"].reshape(-1, sae["W_enc"].shape[0])
            pre = (h - sae["b_dec"]) @ sae["W_enc"] + sae["b_enc"]
            v, i = pre.topk(K, dim=1)
            v = v.relu()
            vals.append(v.numpy())
            idxs.append(i.numpy().astype(np.int32))
            toks.append(t.reshape(-1).numpy())
            pending += h.shape[0]
            if pending >= CHUNK_ROWS:
                flush()
                pending = 0
        flush()
    elapsed = time.perf_counter() - start
    print("tokens_per_second %.1f" % (n_seq * CTX / elapsed), flush=True)


if __name__ == "__main__":
    main()
