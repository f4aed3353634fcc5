"""Parity of latentd's native Hugging Face GPT-2 loader with GPT-2's forward pass in python3-torch.

Writes a small GPT-2 checkpoint as the Hub serves one (config.json with Hugging Face's fields,
model.safetensors with Conv1D weights by their GPT-2 names and the attention-mask buffers), runs
engine/extract_tool DENSE at several TransformerLens hooks, and compares the stored float32 rows
with a forward pass written here from Hugging Face's GPT-2 definition (Conv1D, split heads, causal
mask by the dtype's minimum, gelu_new written out), with the checkpoint's options honoured:
layer_norm_epsilon, scale_attn_by_inverse_layer_idx.
"""
import collections
import json
import math
import os
import sys
import tempfile
import unittest

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from extract_test_util import (assert_dense_rows, assert_stored_latents, run_extract_tool,  # noqa: E402
                               topk_reconstruct, write_hf_checkpoint, write_safetensors,
                               write_topk_sae)

VOCAB, D, LAYERS, HEADS, POSITIONS, CTX = 120, 48, 3, 4, 32, 16
TOOL = os.environ.get("EXTRACT_TOOL", "")  # tests/e2e/test_steering.py imports the model only


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class Gpt2:
    """GPT-2 as Hugging Face computes it, from the checkpoint's tensors; returns TransformerLens
    hook values."""

    def __init__(self, w, cfg):
        self.w, self.cfg = w, cfg

    def conv1d(self, name, x):
        return x @ self.w[name + ".weight"] + self.w[name + ".bias"]

    def layer_norm(self, name, x):
        return torch.nn.functional.layer_norm(x, (D,), self.w[name + ".weight"], self.w[name + ".bias"],
                                              eps=self.cfg["layer_norm_epsilon"])

    def __call__(self, ids, splice=None):
        """Every hook's value; `splice` ({hook: function}) replaces a hook's value on the way."""
        B, S = ids.shape
        hooks = {}

        def at(name, t):
            if splice and name in splice:
                t = splice[name](t)
            hooks[name] = t
            return t

        x = self.w["wte.weight"][ids] + self.w["wpe.weight"][torch.arange(S)]
        mask = torch.tril(torch.ones(S, S, dtype=torch.bool))
        dh = D // HEADS
        for l in range(LAYERS):
            p = "h.%d." % l
            x = at("blocks.%d.hook_resid_pre" % l, x)
            q, k, v = self.conv1d(p + "attn.c_attn", self.layer_norm(p + "ln_1", x)).split(D, dim=2)
            q, k, v = (t.view(B, S, HEADS, dh).permute(0, 2, 1, 3) for t in (q, k, v))
            scores = q @ k.transpose(-1, -2) / math.sqrt(dh)
            if self.cfg.get("scale_attn_by_inverse_layer_idx"):
                scores = scores / float(l + 1)
            scores = torch.where(mask, scores, torch.tensor(torch.finfo(scores.dtype).min))
            # TransformerLens' attn.hook_z [.., heads, d_head], flattened as hook_z SAEs read it
            z = at("blocks.%d.attn.hook_z" % l, (scores.softmax(-1) @ v).permute(0, 2, 1, 3).reshape(B, S, D))
            attn_out = at("blocks.%d.hook_attn_out" % l, self.conv1d(p + "attn.c_proj", z))
            x = at("blocks.%d.hook_resid_mid" % l, x + attn_out)
            # TransformerLens' ln2.hook_normalized is the LayerNorm before its gain and bias (its
            # default fold_ln folds them into the MLP); the MLP's input (mlp.hook_in) has them.
            normed = at("blocks.%d.ln2.hook_normalized" % l, torch.nn.functional.layer_norm(
                x, (D,), eps=self.cfg["layer_norm_epsilon"]))
            mlp_in = at("blocks.%d.mlp.hook_in" % l,
                        normed * self.w[p + "ln_2.weight"] + self.w[p + "ln_2.bias"])
            post = at("blocks.%d.mlp.hook_post" % l, gelu_new(self.conv1d(p + "mlp.c_fc", mlp_in)))
            mlp_out = at("blocks.%d.hook_mlp_out" % l, self.conv1d(p + "mlp.c_proj", post))
            hooks["blocks.%d.mlp.hook_out" % l] = mlp_out  # no norm after GPT-2's MLP
            x = at("blocks.%d.hook_resid_post" % l, x + mlp_out)
        hooks["final"] = x
        return hooks

    def loss(self, ids, splice=None):
        """GPT2LMHeadModel's mean next-token cross-entropy: ln_f, the tied wte as lm_head."""
        logits = self.layer_norm("ln_f", self(ids, splice)["final"]) @ self.w["wte.weight"].T
        return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB),
                                                 ids[:, 1:].reshape(-1)).item()


def random_gpt2_weights(seed=0):
    """A small GPT-2's tensors by their checkpoint names, drawn from `seed`."""
    torch.manual_seed(seed)
    g = lambda *shape, s=0.1: torch.randn(*shape) * s
    w = {"wte.weight": g(VOCAB, D), "wpe.weight": g(POSITIONS, D, s=0.02),
         "ln_f.weight": 1 + g(D), "ln_f.bias": g(D)}
    for l in range(LAYERS):
        p = "h.%d." % l
        w.update({p + "ln_1.weight": 1 + g(D), p + "ln_1.bias": g(D),
                  p + "attn.c_attn.weight": g(D, 3 * D), p + "attn.c_attn.bias": g(3 * D),
                  p + "attn.c_proj.weight": g(D, D), p + "attn.c_proj.bias": g(D),
                  p + "ln_2.weight": 1 + g(D), p + "ln_2.bias": g(D),
                  p + "mlp.c_fc.weight": g(D, 4 * D), p + "mlp.c_fc.bias": g(4 * D),
                  p + "mlp.c_proj.weight": g(4 * D, D), p + "mlp.c_proj.bias": g(D),
                  # buffers older checkpoints carry: the causal mask, not weights
                  p + "attn.bias": torch.tril(torch.ones(1, 1, POSITIONS, POSITIONS)),
                  p + "attn.masked_bias": torch.tensor(-1e4)})
    return w


def gpt2_config(**changes):
    """config.json of that GPT-2 as the Hub writes it, with `changes`."""
    cfg = {"_name_or_path": "tiny-gpt2", "architectures": ["GPT2LMHeadModel"],
           "model_type": "gpt2", "activation_function": "gelu_new", "attn_pdrop": 0.1,
           "bos_token_id": 0, "eos_token_id": 0, "embd_pdrop": 0.1, "initializer_range": 0.02,
           "layer_norm_epsilon": 1e-5, "n_ctx": POSITIONS, "n_embd": D, "n_head": HEADS,
           "n_inner": None, "n_layer": LAYERS, "n_positions": POSITIONS,
           "reorder_and_upcast_attn": False, "resid_pdrop": 0.1, "scale_attn_by_inverse_layer_idx": False,
           "scale_attn_weights": True, "summary_type": "cls_index", "torch_dtype": "float32",
           "transformers_version": "4.36.2", "use_cache": True, "vocab_size": VOCAB}
    cfg.update(changes)
    return cfg


class HfGpt2ParityTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.root = tempfile.mkdtemp(prefix="hf-gpt2-")
        cls.weights = random_gpt2_weights()
        rng = np.random.default_rng(1)
        ids = rng.integers(0, VOCAB, size=9 * CTX, dtype=np.int64).astype(np.uint16)
        np.save(os.path.join(cls.root, "tokens.npy"), ids)
        cls.ids = ids.astype(np.int64)

    def checkpoint(self, name, centered=False, **config_changes):
        d = os.path.join(self.root, name)
        cfg = gpt2_config(**config_changes)
        write_hf_checkpoint(d, cfg, self.weights)
        w = dict(self.weights)
        if centered:
            # TransformerLens' center_writing_weights: what writes to the residual stream (the
            # embeddings, each block's output projections and their biases) loses its mean over
            # d_model.
            for name in ["wte.weight", "wpe.weight"] + [
                    "h.%d.%s.c_proj.%s" % (l, m, t) for l in range(LAYERS) for m in ("attn", "mlp")
                    for t in ("weight", "bias")]:
                w[name] = w[name] - w[name].mean(-1, keepdim=True)
        with torch.no_grad():
            hooks = Gpt2(w, cfg)(torch.from_numpy(self.ids).view(-1, CTX))
        return d, hooks

    def sparse_spec(self, model_dir, hook, sae, **fields):
        """A SPARSE spec of the SAE in `sae` at `hook` over this test's tokens, float32 values, four
        sequences a batch; `fields` (moreOutputs, downstreamLossSequences, ...) added."""
        return dict({"model": {"huggingface": {"path": model_dir}}, "hookName": hook,
                     "sae": {"path": sae}, "valueDtype": "FLOAT32", "batchSequences": 4,
                     "tokens": {"path": os.path.join(self.root, "tokens.npy"), "contextLength": CTX}},
                    **fields)

    def run_tool(self, model_dir, hook, context=CTX, centered=False, sae=None):
        spec = {"model": {"huggingface": {"path": model_dir, "centerWritingWeights": centered}},
                "hookName": hook, "mode": "SPARSE" if sae else "DENSE", "valueDtype": "FLOAT32",
                "tokens": {"path": os.path.join(self.root, "tokens.npy"), "contextLength": context},
                "batchSequences": 4, "commitRows": 64}
        if sae:
            spec["sae"] = {"path": sae}
        return run_extract_tool(TOOL, self.root, spec)

    def check(self, model_dir, hooks, name, centered=False, as_name=None):
        """The rows of hook `name` (asked for as `as_name`, another name of it, when given)."""
        p, out = self.run_tool(model_dir, as_name or name, centered=centered)
        assert_dense_rows(self, p, out, self.ids, hooks[name].reshape(len(self.ids), -1).numpy(), name)

    def test_hooks_match_huggingface_gpt2(self):
        d, hooks = self.checkpoint("plain")
        for name in ["blocks.0.hook_resid_pre", "blocks.1.attn.hook_z", "blocks.0.hook_attn_out",
                     "blocks.1.mlp.hook_post",
                     "blocks.1.hook_resid_mid", "blocks.1.ln2.hook_normalized",
                     "blocks.1.mlp.hook_in", "blocks.1.mlp.hook_out", "blocks.2.hook_resid_post"]:
            self.check(d, hooks, name)
        # sparsify's module paths name the same activations.
        self.check(d, hooks, "blocks.1.hook_resid_post", as_name="h.1")
        self.check(d, hooks, "blocks.2.hook_mlp_out", as_name="transformer.h.2.mlp")

    def test_checkpoint_options_are_honoured(self):
        d, hooks = self.checkpoint("options", layer_norm_epsilon=0.3, scale_attn_by_inverse_layer_idx=True)
        plain = self.checkpoint("plain")[1]
        self.assertFalse(np.allclose(hooks["blocks.2.hook_resid_post"], plain["blocks.2.hook_resid_post"]))
        self.check(d, hooks, "blocks.2.hook_resid_post")

    def test_center_writing_weights_is_transformer_lens_processing(self):
        d, hooks = self.checkpoint("centered", centered=True)
        for name in ["blocks.0.hook_resid_pre", "blocks.1.hook_mlp_out", "blocks.2.hook_resid_post",
                     "blocks.1.mlp.hook_post"]:
            self.check(d, hooks, name, centered=True)

    def test_an_sae_trained_with_the_other_processing_is_flagged(self):
        d, _ = self.checkpoint("plain")
        sae = os.path.join(self.root, "sae_centered")
        os.makedirs(sae, exist_ok=True)
        g = torch.Generator().manual_seed(4)
        write_safetensors(os.path.join(sae, "sae_weights.safetensors"),
                          {"W_enc": torch.randn(D, 64, generator=g), "b_enc": torch.zeros(64),
                           "W_dec": torch.randn(64, D, generator=g), "b_dec": torch.zeros(D)})
        with open(os.path.join(sae, "cfg.json"), "w") as f:
            json.dump({"d_in": D, "d_sae": 64, "architecture": "topk", "k": 4,
                       "hook_name": "blocks.1.hook_resid_pre", "model_name": "tiny-gpt2",
                       "model_from_pretrained_kwargs": {"center_writing_weights": True}}, f)
        p, _ = self.run_tool(d, "blocks.1.hook_resid_pre", sae=sae)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("model it was trained on had center_writing_weights true, and this job's model "
                      "has it false", p.stderr)
        p, _ = self.run_tool(d, "blocks.1.hook_resid_pre", sae=sae, centered=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertNotIn("center_writing_weights", p.stderr)

    def test_downstream_loss_is_gpt2s_own_with_the_sae_spliced_in(self):
        # The job's downstream loss for four SAEs (one per output) against GPT2LMHeadModel's
        # mean next-token cross-entropy computed here: as it is, with the hook's activation
        # replaced by the SAE's TopK reconstruction, and zeroed. At ln2.hook_normalized the
        # replacement reaches the MLP through ln_2's gain and bias; at attn.hook_z (an
        # attention SAE, as Kissane et al.'s) it goes through c_proj.
        d, _ = self.checkpoint("plain")
        model = Gpt2(self.weights, {"layer_norm_epsilon": 1e-5})
        ids = torch.from_numpy(self.ids).view(-1, CTX)
        saes = {}
        for hook, seed in (("blocks.1.hook_resid_post", 5), ("blocks.0.hook_attn_out", 6),
                           ("blocks.1.ln2.hook_normalized", 7), ("blocks.2.attn.hook_z", 10)):
            path = os.path.join(self.root, "sae_" + hook)
            saes[hook] = (path, write_topk_sae(path, D, 128, 8, seed, bias=0.05))

        hooks = list(saes)
        spec = self.sparse_spec(
            d, hooks[0], saes[hooks[0]][0],
            moreOutputs=[{"hookName": h, "sae": {"path": saes[h][0]}} for h in hooks[1:]],
            downstreamLossSequences=100)  # more than the 9 there are
        p, _ = run_extract_tool(TOOL, self.root, spec)
        self.assertEqual(p.returncode, 0, p.stderr)
        result = json.loads(p.stdout)
        got = [result["downstreamLoss"]] + [m["downstreamLoss"] for m in result["moreOutputs"]]
        self.assertEqual(len(got), 4)
        with torch.no_grad():
            clean = model.loss(ids)
            for hook, loss in zip(hooks, got):
                self.assertEqual(int(loss["predictions"]), 9 * (CTX - 1))
                with_sae = model.loss(ids, {hook: topk_reconstruct(saes[hook][1], 8)})
                zeroed = model.loss(ids, {hook: torch.zeros_like})
                self.assertAlmostEqual(loss["clean"], clean, delta=1e-4 * clean)
                self.assertAlmostEqual(loss["withSae"], with_sae, delta=1e-4 * with_sae)
                self.assertAlmostEqual(loss["zeroAblated"], zeroed, delta=1e-4 * zeroed)
                self.assertAlmostEqual(loss["recovered"], (zeroed - with_sae) / (zeroed - clean),
                                       delta=1e-3)
                self.assertEqual(loss.get("recoveredUnreliable", False),
                                 zeroed - clean < 0.01 * clean)
                self.assertNotAlmostEqual(with_sae, clean, delta=1e-3)
        self.assertIn("downstream loss over 135 predictions", p.stderr)

    def test_saelens_input_normalizations(self):
        # SAELens' normalize_activations, as its SAE class runs them at inference: the input
        # normalized per token before b_dec is subtracted, the normalization undone on the
        # reconstruction. "layer_norm" is how SAELens serves OpenAI's GPT-2 TopK SAEs.
        d, hooks = self.checkpoint("plain")
        hook = "blocks.1.hook_resid_post"
        x = hooks[hook].reshape(-1, D)

        def layer_norm(x):
            mu = x.mean(-1, keepdim=True)
            std = (x - mu).std(-1, keepdim=True)
            return (x - mu) / (std + 1e-5), lambda out: out * std + mu

        def constant_norm_rescale(x):
            coeff = D ** 0.5 / x.norm(dim=-1, keepdim=True)
            return x * coeff, lambda out: out / coeff

        model = Gpt2(self.weights, {"layer_norm_epsilon": 1e-5})
        ids = torch.from_numpy(self.ids).view(-1, CTX)
        for seed, (name, normalize) in enumerate((("layer_norm", layer_norm),
                                                  ("constant_norm_rescale", constant_norm_rescale))):
            sae = os.path.join(self.root, "sae_" + name)
            w = write_topk_sae(sae, D, 128, 8, 20 + seed, bias=0.05)
            # The layer_norm one in SAELens 3-5's schema, as its OpenAI GPT-2 SAEs' cfg.json has
            # it: a "standard" architecture whose activation_fn_str is topk.
            cfg = ({"architecture": "standard", "activation_fn_str": "topk",
                    "activation_fn_kwargs": {"k": 8}} if name == "layer_norm"
                   else {"architecture": "topk", "k": 8})
            with open(os.path.join(sae, "cfg.json"), "w") as f:
                json.dump(dict(cfg, d_in=D, d_sae=128, apply_b_dec_to_input=True,
                               normalize_activations=name, hook_name=hook), f)

            def encode(x):
                xn, undo = normalize(x)
                pre = (xn - w["b_dec"]) @ w["W_enc"] + w["b_enc"]
                top = pre.topk(8, dim=-1)
                return torch.zeros_like(pre).scatter(-1, top.indices, top.values.relu()), undo

            def reconstruct(x):
                z, undo = encode(x)
                return undo(z @ w["W_dec"] + w["b_dec"])

            spec = self.sparse_spec(d, hook, sae, downstreamLossSequences=9)
            p, out = run_extract_tool(TOOL, self.root, spec)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertIn("normalize_activations " + name, p.stderr)  # the job log says how
            result = json.loads(p.stdout)
            with torch.no_grad():
                assert_stored_latents(self, out, encode(x)[0].numpy())
                x_hat = reconstruct(x)
                ev = 1 - ((x - x_hat) ** 2).sum().item() / ((x - x.mean(0)) ** 2).sum().item()
                with_sae = model.loss(ids, {hook: lambda t: reconstruct(t.reshape(-1, D)).view(t.shape)})
                # The reconstruction left in the normalized units: what the fit must not be.
                z = encode(x)[0]
                x_hat_normalized = z @ w["W_dec"] + w["b_dec"]
                ev_normalized = 1 - ((x - x_hat_normalized) ** 2).sum().item() / (
                    (x - x.mean(0)) ** 2).sum().item()
            self.assertAlmostEqual(result["fit"]["explainedVariance"], ev, delta=1e-4, msg=name)
            self.assertGreater(abs(ev - ev_normalized), 10 * 1e-4, name)
            loss = result["downstreamLoss"]
            self.assertAlmostEqual(loss["withSae"], with_sae, delta=1e-4 * with_sae, msg=name)

    def test_dictionary_learning_saes_as_saved(self):
        # dictionary_learning (SAEBench's SAEs ship in it): ae.pt, a torch.save'd state dict of
        # the dictionary's nn.Module, beside config.json naming its class. Each class here has the
        # state dict names of dictionary_learning's and encodes as its encode() does, written out.
        d, hooks = self.checkpoint("plain")
        hook = "blocks.1.hook_resid_post"
        x = hooks[hook].reshape(-1, D)
        S = 96
        g = torch.Generator().manual_seed(30)
        rand = lambda *shape, s=0.3: torch.randn(*shape, generator=g) * s
        nn = torch.nn
        relu = torch.relu

        def linear_pair(m):
            m.encoder = nn.Linear(D, S)
            m.decoder = nn.Linear(S, D, bias=False)
            with torch.no_grad():
                m.encoder.weight.copy_(rand(S, D))
                m.encoder.bias.copy_(rand(S, s=0.1))
                m.decoder.weight.copy_(rand(D, S))

        cases = {}
        # AutoEncoder: its decoder a transposed view of the encoder's storage (torch.save keeps
        # the sharing and the strides).
        m = nn.Module()
        linear_pair(m)
        m.decoder.weight = nn.Parameter(m.encoder.weight.detach().t())
        m.bias = nn.Parameter(rand(D, s=0.1))
        cases["AutoEncoder"] = (m, lambda m, x: relu(m.encoder(x - m.bias)),
                                lambda m, f: m.decoder(f) + m.bias, {})
        # AutoEncoderNew: no bias subtracted first, the decoder's own bias.
        m = nn.Module()
        linear_pair(m)
        m.decoder = nn.Linear(S, D)
        with torch.no_grad():
            m.decoder.weight.copy_(rand(D, S))
            m.decoder.bias.copy_(rand(D, s=0.1))
        cases["AutoEncoderNew"] = (m, lambda m, x: relu(m.encoder(x)), lambda m, f: m.decoder(f), {})
        # AutoEncoderTopK, saved in bfloat16.
        m = nn.Module()
        linear_pair(m)
        m.b_dec = nn.Parameter(rand(D, s=0.1))
        m.register_buffer("k", torch.tensor(6, dtype=torch.int))
        m.register_buffer("threshold", torch.tensor(-1.0))
        m = m.to(torch.bfloat16).float()

        def topk_encode(m, x):
            post = relu(m.encoder(x - m.b_dec))
            top = post.topk(int(m.k), dim=-1)
            return torch.zeros_like(post).scatter(-1, top.indices, top.values)
        cases["AutoEncoderTopK"] = (m, topk_encode, lambda m, f: m.decoder(f) + m.b_dec,
                                    {"dtype": torch.bfloat16, "k": 6})
        # BatchTopKSAE at inference: its learned threshold.
        m = nn.Module()
        linear_pair(m)
        m.b_dec = nn.Parameter(rand(D, s=0.1))
        m.register_buffer("k", torch.tensor(6, dtype=torch.int))
        m.register_buffer("threshold", torch.tensor(0.4))

        def batch_encode(m, x):
            post = relu(m.encoder(x - m.b_dec))
            return post * (post > m.threshold)
        cases["BatchTopKSAE"] = (m, batch_encode, lambda m, f: m.decoder(f) + m.b_dec, {"k": 6})
        # MatryoshkaBatchTopKSAE, saved in float16.
        m = nn.Module()
        m.W_enc, m.b_enc = nn.Parameter(rand(D, S)), nn.Parameter(rand(S, s=0.1))
        m.W_dec, m.b_dec = nn.Parameter(rand(S, D)), nn.Parameter(rand(D, s=0.1))
        m.register_buffer("k", torch.tensor(6, dtype=torch.int))
        m.register_buffer("threshold", torch.tensor(0.3))
        m.register_buffer("group_sizes", torch.tensor([16, 32, 48]))
        m = m.half().float()
        m.group_sizes = m.group_sizes.long()

        def matryoshka_encode(m, x):
            post = relu((x - m.b_dec) @ m.W_enc + m.b_enc)
            return post * (post > m.threshold)
        cases["MatryoshkaBatchTopKSAE"] = (m, matryoshka_encode, lambda m, f: f @ m.W_dec + m.b_dec,
                                           {"dtype": torch.float16, "k": 6})
        # JumpReluAutoEncoder: latents scaled by their decoder norms (not 1 here).
        m = nn.Module()
        m.W_enc, m.b_enc = nn.Parameter(rand(D, S)), nn.Parameter(rand(S, s=0.1))
        m.W_dec, m.b_dec = nn.Parameter(rand(S, D)), nn.Parameter(rand(D, s=0.1))
        m.threshold = nn.Parameter(torch.rand(S, generator=g) * 0.5)

        def jump_encode(m, x):
            pre = x @ m.W_enc + m.b_enc
            return relu(pre * (pre > m.threshold)) * m.W_dec.norm(dim=1)
        cases["JumpReluAutoEncoder"] = (
            m, jump_encode, lambda m, f: (f / m.W_dec.norm(dim=1)) @ m.W_dec + m.b_dec, {})

        # GatedAutoEncoder: SAELens' gated encoder, latents times their decoder norms too.
        m = nn.Module()
        m.encoder = nn.Linear(D, S, bias=False)
        m.decoder = nn.Linear(S, D, bias=False)
        with torch.no_grad():
            m.encoder.weight.copy_(rand(S, D))
            m.decoder.weight.copy_(rand(D, S))
        m.decoder_bias = nn.Parameter(rand(D, s=0.1))
        m.r_mag, m.gate_bias, m.mag_bias = (nn.Parameter(rand(S, s=0.2)) for _ in range(3))

        def gated_encode(m, x):
            x_enc = m.encoder(x - m.decoder_bias)
            gate = (x_enc + m.gate_bias > 0).float()
            return gate * relu(m.r_mag.exp() * x_enc + m.mag_bias) * m.decoder.weight.norm(dim=0)
        cases["GatedAutoEncoder"] = (
            m, gated_encode,
            lambda m, f: m.decoder(f / m.decoder.weight.norm(dim=0)) + m.decoder_bias, {})

        for dict_class, (m, encode, decode, extra) in cases.items():
            sae = os.path.join(self.root, "dictionary_learning", dict_class, "resid_post_layer_1",
                               "trainer_0")
            os.makedirs(sae, exist_ok=True)
            state = m.state_dict()
            if "dtype" in extra:
                state = collections.OrderedDict(
                    (k, v.to(extra["dtype"]) if v.is_floating_point() else v) for k, v in state.items())
                state._metadata = m.state_dict()._metadata
            torch.save(state, os.path.join(sae, "ae.pt"))
            with open(os.path.join(sae, "config.json"), "w") as f:
                json.dump({"trainer": {"trainer_class": "Trainer", "dict_class": dict_class,
                                       "activation_dim": D, "dict_size": S, "k": extra.get("k"),
                                       "layer": 1, "lm_name": "tiny-gpt2",
                                       "submodule_name": "resid_post_layer_1"},
                           "buffer": {"d_submodule": D}}, f)
            p, out = run_extract_tool(TOOL, self.root, self.sparse_spec(d, hook, sae))
            self.assertEqual(p.returncode, 0, dict_class + ": " + p.stderr)
            self.assertNotIn("was trained on hook", p.stderr)  # the hook from submodule_name
            self.assertIn("dictionary_learning's %s read as a" % dict_class, p.stderr)
            result = json.loads(p.stdout)
            with torch.no_grad():
                z = encode(m, x)
                assert_stored_latents(self, out, z.numpy())
                x_hat = decode(m, z)
                ev = 1 - ((x - x_hat) ** 2).sum().item() / ((x - x.mean(0)) ** 2).sum().item()
            self.assertAlmostEqual(result["fit"]["explainedVariance"], ev, delta=1e-4 * max(1, abs(ev)),
                                   msg=dict_class)

    def test_goodfire_sae_as_saved(self):
        # Goodfire's SAEs (Llama 3.x): one .pth file, the state dict of a module with
        # encoder_linear and decoder_linear, in bfloat16, that encodes relu(encoder_linear(x)) and
        # decodes decoder_linear(f). No config: the widths come from the tensors, the hook from the
        # job.
        d, hooks = self.checkpoint("plain")
        hook = "blocks.2.hook_resid_post"
        x = hooks[hook].reshape(-1, D)
        g = torch.Generator().manual_seed(31)
        m = torch.nn.Module()
        m.encoder_linear = torch.nn.Linear(D, 80)
        m.decoder_linear = torch.nn.Linear(80, D)
        with torch.no_grad():
            for p in m.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
        m = m.to(torch.bfloat16)
        sae = os.path.join(self.root, "goodfire")
        os.makedirs(sae, exist_ok=True)
        torch.save(m.state_dict(), os.path.join(sae, "Tiny-GPT2-SAE-l2.pth"))
        m = m.float()
        p, out = run_extract_tool(TOOL, self.root, self.sparse_spec(d, hook, sae))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("Goodfire's SparseAutoEncoder read as a relu SAE", p.stderr)
        with torch.no_grad():
            z = torch.relu(m.encoder_linear(x))
            assert_stored_latents(self, out, z.numpy())
            x_hat = m.decoder_linear(z)
            ev = 1 - ((x - x_hat) ** 2).sum().item() / ((x - x.mean(0)) ** 2).sum().item()
        self.assertAlmostEqual(json.loads(p.stdout)["fit"]["explainedVariance"], ev,
                               delta=1e-4 * max(1, abs(ev)))

    def test_a_pickle_that_calls_anything_else_is_refused_unrun(self):
        # ae.pt is a pickle, which may name any Python callable: latentd reads the names of a
        # state dict's, runs none, and refuses any other.
        d, _ = self.checkpoint("plain")
        witness = os.path.join(self.root, "pickle_ran")

        class Payload:
            def __reduce__(self):
                return (os.system, ("touch " + witness,))
        sae = os.path.join(self.root, "dictionary_learning_evil")
        os.makedirs(sae, exist_ok=True)
        torch.save(collections.OrderedDict([("encoder.weight", Payload())]), os.path.join(sae, "ae.pt"))
        with open(os.path.join(sae, "config.json"), "w") as f:
            json.dump({"trainer": {"dict_class": "AutoEncoder", "activation_dim": D, "dict_size": 8}}, f)
        p, _ = self.run_tool(d, "blocks.1.hook_resid_post", sae=sae)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("calls posix.system", p.stderr)
        self.assertFalse(os.path.exists(witness))

    def transcoder_weights(self, seed, skip):
        g = torch.Generator().manual_seed(seed)
        w = {"W_enc": torch.randn(D, 96, generator=g) * 0.3, "b_enc": torch.randn(96, generator=g) * 0.1,
             "W_dec": torch.randn(96, D, generator=g) * 0.05, "b_dec": torch.randn(D, generator=g) * 0.05,
             "threshold": torch.rand(96, generator=g) * 0.5}
        if skip:
            w["W_skip"] = torch.randn(D, D, generator=g) * 0.05
        return w

    def check_transcoder(self, tc, w, hook_in="blocks.1.ln2.hook_normalized"):
        """A JumpReLU transcoder from `hook_in` (the MLP's input) to blocks.1.hook_mlp_out (weights
        `w`, in directory `tc`) as SAELens computes it: the stored latents are those of the MLP's
        normed input (b_dec, an output-side bias, is not subtracted), the fit compares the
        prediction (+ x W_skip^T) with the MLP's output, and the downstream loss puts the
        prediction in place of that output."""
        d, hooks = self.checkpoint("plain")

        def encode(x):
            pre = x @ w["W_enc"] + w["b_enc"]
            return pre * (pre > w["threshold"])

        def predict(x):
            out = encode(x) @ w["W_dec"] + w["b_dec"]
            return out + x @ w["W_skip"].T if "W_skip" in w else out

        spec = self.sparse_spec(d, hook_in, tc, downstreamLossSequences=9)
        p, out = run_extract_tool(TOOL, self.root, spec)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertNotIn("was trained on hook", p.stderr)
        result = json.loads(p.stdout)
        x = hooks[hook_in].reshape(-1, D)
        y = hooks["blocks.1.hook_mlp_out"].reshape(-1, D)
        with torch.no_grad():
            z = encode(x).numpy()
            pred = predict(x)
        assert_stored_latents(self, out, z)
        ev = 1 - ((y - pred) ** 2).sum().item() / ((y - y.mean(0)) ** 2).sum().item()
        self.assertAlmostEqual(result["fit"]["explainedVariance"], ev, delta=1e-4 * max(1, abs(ev)))
        model = Gpt2(self.weights, {"layer_norm_epsilon": 1e-5})
        ids = torch.from_numpy(self.ids).view(-1, CTX)
        with torch.no_grad():
            clean = model.loss(ids)
            # The MLP's input is upstream of its output: the clean pass's is the spliced pass's.
            with_tc = model.loss(ids, {"blocks.1.hook_mlp_out": lambda t: predict(x).view(t.shape)})
            zeroed = model.loss(ids, {"blocks.1.hook_mlp_out": torch.zeros_like})
        loss = result["downstreamLoss"]
        self.assertAlmostEqual(loss["clean"], clean, delta=1e-4 * clean)
        self.assertAlmostEqual(loss["withSae"], with_tc, delta=1e-4 * with_tc)
        self.assertAlmostEqual(loss["zeroAblated"], zeroed, delta=1e-4 * zeroed)
        self.assertNotAlmostEqual(with_tc, clean, delta=1e-3)

    def test_saelens_skip_transcoder(self):
        w = self.transcoder_weights(8, skip=True)
        tc = os.path.join(self.root, "transcoder")
        os.makedirs(tc, exist_ok=True)
        write_safetensors(os.path.join(tc, "sae_weights.safetensors"), w)
        with open(os.path.join(tc, "cfg.json"), "w") as f:
            json.dump({"architecture": "jumprelu_skip_transcoder", "d_in": D, "d_out": D, "d_sae": 96,
                       "apply_b_dec_to_input": True,  # SAELens ignores it for transcoders
                       "hook_name": "blocks.1.ln2.hook_normalized",
                       "hook_name_out": "blocks.1.hook_mlp_out"}, f)
        self.check_transcoder(tc, w)

    def test_gemma_scope_transcoder_as_downloaded(self):
        # gemma-scope-2b-pt-transcoders/layer_L/width_N/average_l0_M/params.npz: the path says
        # transcoder, its input (the MLP's normed input) and its output (the MLP's).
        w = self.transcoder_weights(9, skip=False)
        tc = os.path.join(self.root, "gemma-scope-tiny-transcoders", "layer_1", "width_96",
                          "average_l0_5")
        os.makedirs(tc, exist_ok=True)
        np.savez(os.path.join(tc, "params.npz"), **{k: v.numpy() for k, v in w.items()})
        self.check_transcoder(tc, w)

    def test_circuit_tracer_transcoder_set(self):
        # circuit-tracer's per-layer transcoders: config.yaml and layer_L.safetensors with
        # nn.Linear's W_enc [d_sae, d_in] and the JumpReLU threshold under its module's name;
        # the job's hook picks layer 1.
        tc = os.path.join(self.root, "circuit-tracer-plt")
        os.makedirs(tc, exist_ok=True)
        with open(os.path.join(tc, "config.yaml"), "w") as f:
            f.write('model_kind: transcoder_set\nfeature_input_hook: "mlp.hook_in"\n'
                    'feature_output_hook: "mlp.hook_out"\nscan: test/plt\ntranscoders:\n'
                    '  - hf://test/plt/layer_0.safetensors\n')
        layers = [self.transcoder_weights(10 + l, skip=True) for l in range(LAYERS)]
        for l, w in enumerate(layers):
            write_safetensors(os.path.join(tc, "layer_%d.safetensors" % l),
                              {"W_enc": w["W_enc"].T.contiguous(), "b_enc": w["b_enc"],
                               "W_dec": w["W_dec"], "b_dec": w["b_dec"], "W_skip": w["W_skip"],
                               "activation_function.threshold": w["threshold"]})
        self.check_transcoder(tc, layers[1], hook_in="blocks.1.mlp.hook_in")

    def test_circuit_tracer_cross_layer_transcoder(self):
        """circuit-tracer's CLT over every layer: layer L's latents read hook_resid_mid of block L
        and write to hook_mlp_out of blocks L.. through W_dec_L [d_sae, layers - L, D]. One job
        extracts every layer; each layer's fit is measured against the sum of the decoders of the
        layers up to it, as circuit-tracer reconstructs the MLP outputs."""
        d, hooks = self.checkpoint("plain")
        clt = os.path.join(self.root, "circuit-tracer-clt")
        os.makedirs(clt, exist_ok=True)
        with open(os.path.join(clt, "config.yaml"), "w") as f:
            f.write("model_kind: cross_layer_transcoder\nfeature_input_hook: hook_resid_mid\n"
                    "feature_output_hook: hook_mlp_out\n")
        g = torch.Generator().manual_seed(21)
        W_enc = [torch.randn(64, D, generator=g) * 0.5 for _ in range(LAYERS)]
        b_enc = [torch.randn(64, generator=g) * 0.1 for _ in range(LAYERS)]
        b_dec = [torch.randn(D, generator=g) * 0.05 for _ in range(LAYERS)]
        threshold = [torch.rand(64, generator=g) * 0.3 for _ in range(LAYERS)]
        W_dec = [torch.randn(64, LAYERS - l, D, generator=g) * 0.05 for l in range(LAYERS)]
        for l in range(LAYERS):
            write_safetensors(os.path.join(clt, "W_enc_%d.safetensors" % l),
                              {"W_enc_%d" % l: W_enc[l], "b_enc_%d" % l: b_enc[l],
                               "b_dec_%d" % l: b_dec[l], "threshold_%d" % l: threshold[l]})
            write_safetensors(os.path.join(clt, "W_dec_%d.safetensors" % l), {"W_dec_%d" % l: W_dec[l]})
        last = LAYERS - 1
        spec = self.sparse_spec(
            d, "blocks.%d.hook_resid_mid" % last, clt, downstreamLossSequences=9,
            moreOutputs=[{"hookName": "blocks.%d.hook_resid_mid" % l, "sae": {"path": clt}}
                         for l in range(last)])
        p, out = run_extract_tool(TOOL, self.root, spec)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertNotIn("not measured", p.stderr)
        result = json.loads(p.stdout)
        with torch.no_grad():
            z = []
            for l in range(LAYERS):  # circuit-tracer's encode_layer and its JumpReLU
                pre = torch.einsum("...d,fd->...f", hooks["blocks.%d.hook_resid_mid" % l].reshape(-1, D),
                                   W_enc[l]) + b_enc[l]
                z.append(pre * (pre > threshold[l]))
            fits = [result["moreOutputs"][l]["fit"] for l in range(last)] + [result["fit"]]
            losses = [result["moreOutputs"][l]["downstreamLoss"] for l in range(last)] + [
                result["downstreamLoss"]]
            model = Gpt2(self.weights, {"layer_norm_epsilon": 1e-5})
            ids = torch.from_numpy(self.ids).view(-1, CTX)
            for target in range(LAYERS):
                pred = b_dec[target] + sum(z[l] @ W_dec[l][:, target - l] for l in range(target + 1))
                # Replacing one layer's MLP output leaves the pass clean up to it: the earlier
                # layers' latents are the clean ones.
                with_clt = model.loss(ids, {"blocks.%d.hook_mlp_out" % target: lambda t: pred.view(t.shape)})
                self.assertAlmostEqual(losses[target]["withSae"], with_clt, delta=1e-4 * with_clt)
                # circuit-tracer's replacement model up to `target`: each layer's latents read
                # from the pass as replaced so far, each MLP output replaced.
                codes = {}

                def observe(l):
                    def f(t):
                        pre = torch.einsum("...d,fd->...f", t.reshape(-1, D), W_enc[l]) + b_enc[l]
                        codes[l] = pre * (pre > threshold[l])
                        return t
                    return f

                def replace(j):
                    return lambda t: (b_dec[j] + sum(codes[l] @ W_dec[l][:, j - l]
                                                     for l in range(j + 1))).view(t.shape)
                splice = {}
                for j in range(target + 1):
                    splice["blocks.%d.hook_resid_mid" % j] = observe(j)
                    splice["blocks.%d.hook_mlp_out" % j] = replace(j)
                replaced = model.loss(ids, splice)
                self.assertAlmostEqual(losses[target]["withLayersReplaced"], replaced, delta=1e-4 * replaced)
                y = hooks["blocks.%d.hook_mlp_out" % target].reshape(-1, D)
                ev = 1 - ((y - pred) ** 2).sum().item() / ((y - y.mean(0)) ** 2).sum().item()
                self.assertEqual(fits[target]["predictedHook"], "blocks.%d.hook_mlp_out" % target)
                self.assertAlmostEqual(fits[target]["explainedVariance"], ev, delta=1e-4 * max(1, abs(ev)))
        assert_stored_latents(self, out, z[last].numpy())

    def test_sequences_longer_than_the_positions_are_refused(self):
        d, _ = self.checkpoint("plain")
        p, _ = self.run_tool(d, "blocks.0.hook_resid_post", context=POSITIONS + 1)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("extract.tokens.context_length: 33 > the model's context 32", p.stderr)


if __name__ == "__main__":
    unittest.main()
