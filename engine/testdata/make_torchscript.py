"""Writes small TorchScript modules for engine/torchscript_model_test (run by a genrule with
Debian's python3-torch): hidden.pt returns a list of 3 hidden states [B, S, 8] (embedding, then
two residual layers); tensor.pt returns a single 2-D tensor (no hidden-state list)."""
import sys

import torch


class Hidden(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(20, 8)
        self.layers = torch.nn.ModuleList([torch.nn.Linear(8, 8) for _ in range(2)])

    def forward(self, tokens: torch.Tensor):
        x = self.emb(tokens)
        out = [x]
        for layer in self.layers:
            x = x + torch.tanh(layer(x))
            out.append(x)
        return out


class Flat(torch.nn.Module):
    def forward(self, tokens: torch.Tensor):
        return tokens.float()


torch.manual_seed(0)
torch.jit.script(Hidden()).save(sys.argv[1])
torch.jit.script(Flat()).save(sys.argv[2])
