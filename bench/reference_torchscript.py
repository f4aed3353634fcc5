"""The reference transformer as a TorchScript module in the Hugging Face layout, for
bench/extract_bench.cc --torchscript: weights from the bench's reference.safetensors, forward
returning every hidden state (the embedding output, then each block's output), as a model
exported with output_hidden_states=True does. TorchScript gives no early exit, so every job runs
the whole forward whatever hook it reads. Writes DIR/reference.pt.
"""
import argparse
import math
import os

import torch

from extract_python_peer import read_safetensors

WEIGHTS = ["ln1.w", "ln1.b", "attn.W_qkv", "attn.b_qkv", "attn.W_O", "attn.b_O", "ln2.w", "ln2.b",
           "mlp.W_in", "mlp.b_in", "mlp.W_out", "mlp.b_out"]


class Block(torch.nn.Module):
    def __init__(self, w, prefix: str, heads: int):
        super().__init__()
        for name in WEIGHTS:
            self.register_buffer(name.replace(".", "_"), w[prefix + name])
        self.heads = heads

    def forward(self, x):
        B, S, d = x.shape[0], x.shape[1], x.shape[2]
        H = self.heads
        dh = d // H
        h = torch.nn.functional.layer_norm(x, [d], self.ln1_w, self.ln1_b, 1e-5)
        qkv = (h @ self.attn_W_qkv + self.attn_b_qkv).view(B, S, 3, H, dh)
        q = qkv[:, :, 0].transpose(1, 2)
        k = qkv[:, :, 1].transpose(1, 2)
        v = qkv[:, :, 2].transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(dh)
        mask = torch.ones(S, S, dtype=torch.bool, device=x.device).triu(1)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        x = x + (att @ v).transpose(1, 2).reshape(B, S, d) @ self.attn_W_O + self.attn_b_O
        h2 = torch.nn.functional.layer_norm(x, [d], self.ln2_w, self.ln2_b, 1e-5)
        mlp = torch.nn.functional.gelu(h2 @ self.mlp_W_in + self.mlp_b_in, approximate="tanh")
        return x + mlp @ self.mlp_W_out + self.mlp_b_out


class HiddenStates(torch.nn.Module):
    def __init__(self, w, heads: int):
        super().__init__()
        self.register_buffer("W_E", w["embed.W_E"])
        self.register_buffer("W_pos", w["embed.W_pos"])
        n_layers = 1 + max(int(k.split(".")[1]) for k in w if k.startswith("blocks."))
        self.blocks = torch.nn.ModuleList(
            [Block(w, "blocks.%d." % l, heads) for l in range(n_layers)])

    def forward(self, tokens):
        x = self.W_E[tokens] + self.W_pos[: tokens.shape[1]]
        states = [x]
        for block in self.blocks:
            x = block(x)
            states.append(x)
        return states


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--heads", type=int, default=4)
    a = ap.parse_args()
    w = read_safetensors(os.path.join(a.dir, "reference.safetensors"))
    torch.jit.script(HiddenStates(w, a.heads).eval()).save(os.path.join(a.dir, "reference.pt"))


if __name__ == "__main__":
    main()
