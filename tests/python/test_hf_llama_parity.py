"""Parity of latentd's native Llama-architecture loader (llama, mistral, qwen2, qwen3, gemma2,
gemma3, olmo2, phi3) with the forward pass written here in python3-torch from Hugging Face's
modeling_llama / modeling_qwen2 / modeling_qwen3 / modeling_gemma2 / modeling_gemma3 /
modeling_olmo2 / modeling_phi3: RMSNorm in float32 (Gemma:
times 1 + w), rotary embeddings with the half-split rotate_half (and Llama 3's or linear
rope_scaling), grouped-query attention by repeating key/value heads, the gated MLP; Gemma 2's
embedding scale, attention-logit soft-capping, query_pre_attn_scalar and norms after attention
and MLP; Qwen3's and Gemma 3's norm of each query and key head; Gemma 3's sliding-window local
layers with their own rotary base; OLMo 2's norms after attention and MLP only and its norm over
all query (key) heads at once; Phi-3's fused projections, LongRoPE and partial rotary. Small
checkpoints are
written as the Hub serves them (config.json + model.safetensors with nn.Linear [out, in] weights
under "model."), extract_tool runs DENSE at TransformerLens hooks, and the stored float32 rows
must equal the Python values within 1e-5 of the largest.
"""
import json
import math
import os
import sys
import tempfile
import unittest

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from extract_test_util import (assert_dense_rows, run_extract_tool,  # noqa: E402
                               topk_reconstruct, write_hf_checkpoint, write_topk_sae)

VOCAB, D, LAYERS, HEADS, KV_HEADS, HEAD_DIM, FF, CTX = 150, 64, 3, 4, 2, 16, 96, 16
TOOL = os.environ["EXTRACT_TOOL"]


def inverse_frequencies(cfg, seq_len=0):
    dim = int(cfg.get("head_dim", D // HEADS) * cfg.get("partial_rotary_factor", 1.0))
    inv = 1.0 / (cfg.get("rope_theta", 10000.0) ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    r = cfg.get("rope_scaling")
    if r and r.get("rope_type") == "longrope":
        # Hugging Face's _compute_longrope_parameters: the long factors past the original context
        original = cfg["original_max_position_embeddings"]
        factors = r["long_factor"] if seq_len > original else r["short_factor"]
        inv = inv / torch.tensor(factors, dtype=torch.float64)
    if r and r.get("rope_type") == "linear":
        inv = inv / r["factor"]
    if r and r.get("rope_type") == "llama3":
        # Hugging Face's _compute_llama3_parameters, element by element
        old, lo, hi, factor = (r["original_max_position_embeddings"], r["low_freq_factor"],
                               r["high_freq_factor"], r["factor"])
        out = []
        for f in inv.tolist():
            wavelen = 2 * math.pi / f
            if wavelen < old / hi:
                out.append(f)
            elif wavelen > old / lo:
                out.append(f / factor)
            else:
                smooth = (old / wavelen - lo) / (hi - lo)
                out.append((1 - smooth) * f / factor + smooth * f)
        inv = torch.tensor(out, dtype=torch.float64)
    return inv.float()


class Llama:
    def __init__(self, w, cfg):
        self.w, self.cfg = w, cfg

    def linear(self, name, x):
        y = x @ self.w[name + ".weight"].t()
        return y + self.w[name + ".bias"] if name + ".bias" in self.w else y

    def norm(self, name, x):
        var = x.pow(2).mean(-1, keepdim=True)
        gain = self.w[name + ".weight"] + (1.0 if self.gemma else 0.0)  # Gemma stores w, uses 1 + w
        return gain * (x * torch.rsqrt(var + self.cfg["rms_norm_eps"]))

    @property
    def gemma(self):
        return self.cfg["model_type"] in ("gemma", "gemma2", "gemma3_text")

    @property
    def gemma2(self):  # Gemma 2's layout, which Gemma 3 keeps
        return self.cfg["model_type"] in ("gemma2", "gemma3_text")

    @property
    def qk_norm(self):
        return self.cfg["model_type"] in ("qwen3", "gemma3_text")

    @property
    def olmo2(self):  # norms only after attention and MLP; one norm over all query (key) heads
        return self.cfg["model_type"] == "olmo2"

    def attention_factor(self):
        """LongRoPE's scale of cos and sin: sqrt(1 + ln(s) / ln(original)) for a context grown s-fold."""
        r, original = self.cfg.get("rope_scaling"), self.cfg.get("original_max_position_embeddings")
        if not r or r.get("rope_type") != "longrope":
            return 1.0
        s = self.cfg["max_position_embeddings"] / original
        return math.sqrt(1 + math.log(s) / math.log(original)) if s > 1 else 1.0

    def sliding(self, layer):
        """Gemma 3: whether this layer attends within a window (layer_types, else the pattern)."""
        if self.cfg["model_type"] != "gemma3_text":
            return False
        if self.cfg.get("layer_types"):
            return self.cfg["layer_types"][layer] == "sliding_attention"
        return (layer + 1) % self.cfg.get("sliding_window_pattern", 6) != 0

    def __call__(self, ids, splice=None):
        """Every hook's value; `splice` ({resid_post hook: function}) replaces a block's output."""
        B, S = ids.shape
        dh = self.cfg.get("head_dim", D // HEADS)
        pos = torch.arange(S).float()

        def cos_sin(cfg, scale=1.0):
            freqs = torch.outer(pos, inverse_frequencies(cfg, S))
            emb = torch.cat([freqs, freqs], dim=-1)
            return emb.cos() * scale, emb.sin() * scale

        global_cs = cos_sin(self.cfg, self.attention_factor())
        rd = global_cs[0].shape[-1]  # Phi-3's partial_rotary_factor: the rest of each head passes
        # Gemma 3's local layers: their own base, no scaling
        local_cs = cos_sin({"head_dim": dh, "rope_theta": self.cfg.get("rope_local_base_freq", 1e4)})

        def rotate_half(x):
            x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
            return torch.cat([-x2, x1], dim=-1)

        def rotary(x, cos, sin):
            r, rest = x[..., :rd], x[..., rd:]
            return torch.cat([r * cos + rotate_half(r) * sin, rest], dim=-1)

        hooks = {}
        x = self.w["model.embed_tokens.weight"][ids]
        if self.gemma:
            x = x * torch.tensor(D ** 0.5)
        causal = torch.full((S, S), float("-inf")).triu(1)
        i, j = torch.arange(S)[:, None], torch.arange(S)[None, :]
        window = self.cfg.get("sliding_window") or S
        windowed = causal.masked_fill(i - j >= window, float("-inf"))
        for l in range(LAYERS):
            p = "model.layers.%d." % l
            hooks["blocks.%d.hook_resid_pre" % l] = x
            h = x if self.olmo2 else self.norm(p + "input_layernorm", x)
            q, k = self.linear(p + "self_attn.q_proj", h), self.linear(p + "self_attn.k_proj", h)
            if self.olmo2:
                q, k = self.norm(p + "self_attn.q_norm", q), self.norm(p + "self_attn.k_norm", k)
            q, k = q.view(B, S, HEADS, dh), k.view(B, S, KV_HEADS, dh)
            if self.qk_norm:
                q, k = self.norm(p + "self_attn.q_norm", q), self.norm(p + "self_attn.k_norm", k)
            q, k = q.transpose(1, 2), k.transpose(1, 2)
            v = self.linear(p + "self_attn.v_proj", h).view(B, S, KV_HEADS, dh).transpose(1, 2)
            cos, sin = local_cs if self.sliding(l) else global_cs
            mask = windowed if self.sliding(l) else causal
            q, k = rotary(q, cos, sin), rotary(k, cos, sin)
            rep = HEADS // KV_HEADS  # repeat_kv: each key/value head serves `rep` query heads
            k = k[:, :, None].expand(B, KV_HEADS, rep, S, dh).reshape(B, HEADS, S, dh)
            v = v[:, :, None].expand(B, KV_HEADS, rep, S, dh).reshape(B, HEADS, S, dh)
            if self.gemma2:
                scores = q @ k.transpose(2, 3) * self.cfg["query_pre_attn_scalar"] ** -0.5
                cap = self.cfg.get("attn_logit_softcapping")
                if cap:
                    scores = torch.tanh(scores / cap) * cap
            else:
                scores = q @ k.transpose(2, 3) / math.sqrt(dh)
            att = (scores + mask).softmax(-1)
            z = (att @ v).transpose(1, 2).reshape(B, S, HEADS * dh)
            hooks["blocks.%d.attn.hook_z" % l] = z  # o_proj's input, heads side by side
            attn_out = self.linear(p + "self_attn.o_proj", z)
            if self.gemma2 or self.olmo2:
                attn_out = self.norm(p + "post_attention_layernorm", attn_out)
            hooks["blocks.%d.hook_attn_out" % l] = attn_out
            x = x + attn_out
            hooks["blocks.%d.hook_resid_mid" % l] = x
            norm_name = p + ("pre_feedforward_layernorm" if self.gemma2 else "post_attention_layernorm")
            h2 = x if self.olmo2 else self.norm(norm_name, x)
            # TransformerLens' ln2.hook_normalized: the RMS-normalized input before the gain; a
            # replacement spliced in there reaches the MLP through the gain.
            ln2 = "blocks.%d.ln2.hook_normalized" % l
            normed = x if self.olmo2 else x * torch.rsqrt(
                x.pow(2).mean(-1, keepdim=True) + self.cfg["rms_norm_eps"])
            if splice and ln2 in splice and not self.olmo2:
                normed = splice[ln2](normed)
                h2 = (self.w[norm_name + ".weight"] + (1.0 if self.gemma else 0.0)) * normed
            hooks[ln2] = normed
            hooks["blocks.%d.mlp.hook_in" % l] = h2
            act = (lambda t: torch.nn.functional.gelu(t, approximate="tanh")) if self.gemma else torch.nn.functional.silu
            post = act(self.linear(p + "mlp.gate_proj", h2)) * self.linear(p + "mlp.up_proj", h2)
            hooks["blocks.%d.mlp.hook_post" % l] = post
            mlp_out = self.linear(p + "mlp.down_proj", post)
            hooks["blocks.%d.mlp.hook_out" % l] = mlp_out  # what the MLP module returns
            if self.gemma2 or self.olmo2:
                mlp_out = self.norm(p + "post_feedforward_layernorm", mlp_out)
            hooks["blocks.%d.hook_mlp_out" % l] = mlp_out
            x = x + mlp_out
            if splice and "blocks.%d.hook_resid_post" % l in splice:
                x = splice["blocks.%d.hook_resid_post" % l](x)
            hooks["blocks.%d.hook_resid_post" % l] = x
        hooks["final"] = x
        return hooks

    def loss(self, ids, splice=None):
        """The CausalLM's mean next-token cross-entropy: model.norm, lm_head (or the tied
        embedding), Gemma 2's final_logit_softcapping."""
        x = self.norm("model.norm", self(ids, splice)["final"])
        logits = x @ self.w.get("lm_head.weight", self.w["model.embed_tokens.weight"]).t()
        cap = self.cfg.get("final_logit_softcapping")
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB),
                                                 ids[:, 1:].reshape(-1)).item()


class Neox:
    """GPT-NeoX (Pythia) as Hugging Face's modeling_gpt_neox computes it."""

    def __init__(self, w, cfg):
        self.w, self.cfg = w, cfg

    def linear(self, name, x):
        return x @ self.w[name + ".weight"].t() + self.w[name + ".bias"]

    def ln(self, name, x):
        return torch.nn.functional.layer_norm(x, (D,), self.w[name + ".weight"], self.w[name + ".bias"],
                                              eps=self.cfg["layer_norm_eps"])

    def __call__(self, ids, splice=None):
        B, S = ids.shape
        dh = D // HEADS
        rd = int(dh * self.cfg["rotary_pct"])
        inv = 1.0 / (self.cfg["rotary_emb_base"] ** (torch.arange(0, rd, 2).float() / rd))
        freqs = torch.outer(torch.arange(S).float(), inv)
        emb = torch.cat([freqs, freqs], dim=-1)
        cos, sin = emb.cos(), emb.sin()

        def rotary(x):
            r, rest = x[..., :rd], x[..., rd:]
            r1, r2 = r[..., : rd // 2], r[..., rd // 2:]
            return torch.cat([r * cos + torch.cat([-r2, r1], dim=-1) * sin, rest], dim=-1)

        hooks = {}
        x = self.w["gpt_neox.embed_in.weight"][ids]
        mask = torch.full((S, S), float("-inf")).triu(1)
        for l in range(LAYERS):
            p = "gpt_neox.layers.%d." % l
            hooks["blocks.%d.hook_resid_pre" % l] = x
            qkv = self.linear(p + "attention.query_key_value", self.ln(p + "input_layernorm", x))
            qkv = qkv.view(B, S, HEADS, 3 * dh).permute(0, 2, 1, 3)
            q, k, v = rotary(qkv[..., :dh]), rotary(qkv[..., dh:2 * dh]), qkv[..., 2 * dh:]
            att = (q @ k.transpose(2, 3) / math.sqrt(dh) + mask).softmax(-1)
            attn_out = self.linear(p + "attention.dense", (att @ v).permute(0, 2, 1, 3).reshape(B, S, D))
            hooks["blocks.%d.hook_attn_out" % l] = attn_out
            if not self.cfg["use_parallel_residual"]:
                x = x + attn_out
                hooks["blocks.%d.hook_resid_mid" % l] = x
            h2 = self.ln(p + "post_attention_layernorm", x)  # resid_pre with a parallel residual
            hooks["blocks.%d.ln2.hook_normalized" % l] = torch.nn.functional.layer_norm(
                x, (D,), eps=self.cfg["layer_norm_eps"])  # before the gain and bias
            hooks["blocks.%d.mlp.hook_in" % l] = h2
            post = torch.nn.functional.gelu(self.linear(p + "mlp.dense_h_to_4h", h2))
            hooks["blocks.%d.mlp.hook_post" % l] = post
            mlp_out = self.linear(p + "mlp.dense_4h_to_h", post)
            hooks["blocks.%d.mlp.hook_out" % l] = mlp_out
            hooks["blocks.%d.hook_mlp_out" % l] = mlp_out
            x = x + attn_out + mlp_out if self.cfg["use_parallel_residual"] else x + mlp_out
            if splice and "blocks.%d.hook_resid_post" % l in splice:
                x = splice["blocks.%d.hook_resid_post" % l](x)
            hooks["blocks.%d.hook_resid_post" % l] = x
        hooks["final"] = x
        return hooks

    def loss(self, ids, splice=None):
        """GPTNeoXForCausalLM's mean next-token cross-entropy: final_layer_norm, embed_out."""
        logits = self.ln("gpt_neox.final_layer_norm", self(ids, splice)["final"]) @ \
            self.w["embed_out.weight"].t()
        return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB),
                                                 ids[:, 1:].reshape(-1)).item()


class HfLlamaParityTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.root = tempfile.mkdtemp(prefix="hf-llama-")
        rng = np.random.default_rng(2)
        ids = rng.integers(0, VOCAB, size=7 * CTX, dtype=np.int64).astype(np.uint16)
        np.save(os.path.join(cls.root, "tokens.npy"), ids)
        cls.ids = ids.astype(np.int64)

    def checkpoint(self, name, model_type="llama", qkv_bias=False, tied=False, seed=None, multimodal=False,
                   **config_changes):
        torch.manual_seed(len(name) if seed is None else seed)
        g = lambda *shape, s=0.1: torch.randn(*shape) * s
        q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
        w = {"model.embed_tokens.weight": g(VOCAB, D, s=1.0), "model.norm.weight": 1 + g(D)}
        if not tied:
            w["lm_head.weight"] = g(VOCAB, D)
        for l in range(LAYERS):
            p = "model.layers.%d." % l
            w.update({p + "input_layernorm.weight": 1 + g(D), p + "post_attention_layernorm.weight": 1 + g(D),
                      p + "self_attn.q_proj.weight": g(q, D), p + "self_attn.k_proj.weight": g(kv, D),
                      p + "self_attn.v_proj.weight": g(kv, D), p + "self_attn.o_proj.weight": g(D, q),
                      p + "mlp.gate_proj.weight": g(FF, D), p + "mlp.up_proj.weight": g(FF, D),
                      p + "mlp.down_proj.weight": g(D, FF),
                      # a buffer some checkpoints carry: not a weight
                      p + "self_attn.rotary_emb.inv_freq": torch.ones(HEAD_DIM // 2)})
            if model_type in ("qwen3", "gemma3_text"):  # a norm over each query and key head
                off = 0 if model_type == "gemma3_text" else 1
                w.update({p + "self_attn.q_norm.weight": off + g(HEAD_DIM, s=0.3),
                          p + "self_attn.k_norm.weight": off + g(HEAD_DIM, s=0.3)})
            if model_type in ("gemma2", "gemma3_text"):  # gains stored as w, applied as 1 + w
                w.update({p + "input_layernorm.weight": g(D), p + "post_attention_layernorm.weight": g(D),
                          p + "pre_feedforward_layernorm.weight": g(D),
                          p + "post_feedforward_layernorm.weight": g(D)})
            if qkv_bias:
                w.update({p + "self_attn.q_proj.bias": g(q), p + "self_attn.k_proj.bias": g(kv),
                          p + "self_attn.v_proj.bias": g(kv)})
            if model_type == "olmo2":  # no norms before; norms after; q/k norms over all heads
                del w[p + "input_layernorm.weight"]
                w.update({p + "post_feedforward_layernorm.weight": 1 + g(D),
                          p + "self_attn.q_norm.weight": 1 + g(q, s=0.3),
                          p + "self_attn.k_norm.weight": 1 + g(kv, s=0.3)})
        cfg = {"architectures": ["LlamaForCausalLM"], "model_type": model_type, "hidden_size": D,
               "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
               "head_dim": HEAD_DIM, "intermediate_size": FF, "vocab_size": VOCAB,
               "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
               "hidden_act": "silu", "tie_word_embeddings": tied, "torch_dtype": "bfloat16",
               "bos_token_id": 1, "eos_token_id": 2, "attention_dropout": 0.0, "rope_scaling": None}
        cfg.update(config_changes)
        d = os.path.join(self.root, name)
        if multimodal:  # Gemma3ForConditionalGeneration's layout around the same language model
            # as released ("language_model.model.layers...") or as newer transformers save it
            # ("model.language_model.layers...")
            rename = ((lambda k: "language_model." + k) if multimodal == "released" else
                      (lambda k: k.replace("model.", "model.language_model.", 1)))
            stored = {rename(k): t for k, t in w.items()}
            stored["vision_tower.vision_model.embeddings.patch_embedding.weight"] = g(8, 3, 2, 2)
            stored["multi_modal_projector.mm_input_projection_weight"] = g(8, D)
            write_hf_checkpoint(d, {"architectures": ["Gemma3ForConditionalGeneration"],
                                    "model_type": "gemma3", "text_config": cfg,
                                    "vision_config": {"model_type": "siglip_vision_model"}}, stored)
        elif model_type == "phi3":  # q/k/v and gate/up stored fused, one matrix each
            stored = dict(w)
            for l in range(LAYERS):
                p = "model.layers.%d." % l
                stored[p + "self_attn.qkv_proj.weight"] = torch.cat(
                    [stored.pop(p + "self_attn.%s_proj.weight" % n) for n in "qkv"])
                stored[p + "mlp.gate_up_proj.weight"] = torch.cat(
                    [stored.pop(p + "mlp.%s_proj.weight" % n) for n in ("gate", "up")])
            write_hf_checkpoint(d, cfg, stored)
        else:
            write_hf_checkpoint(d, cfg, w)
        self.last = Llama(w, cfg)
        with torch.no_grad():
            hooks = self.last(torch.from_numpy(self.ids).view(-1, CTX))
        return d, hooks

    def run_tool(self, model_dir, hook, context=CTX, centered=False, dtype="FLOAT32"):
        spec = {"model": {"huggingface": {"path": model_dir, "centerWritingWeights": centered,
                                          "dtype": dtype}},
                "hookName": hook, "mode": "DENSE", "valueDtype": "FLOAT32",
                "tokens": {"path": os.path.join(self.root, "tokens.npy"), "contextLength": context},
                "batchSequences": 3, "commitRows": 48}
        return run_extract_tool(TOOL, self.root, spec)

    def check(self, model_dir, hooks, name, as_name=None):
        p, out = self.run_tool(model_dir, as_name or name)
        assert_dense_rows(self, p, out, self.ids, hooks[name].reshape(len(self.ids), -1).numpy(), name)

    def check_downstream_loss(self, model_dir, hook="blocks.1.hook_resid_post"):
        """The job's downstream loss for a TopK SAE at `hook` against the model's own next-token
        cross-entropy computed here (self.last): as it is, with the SAE's reconstruction spliced
        in, and with the hook zeroed."""
        sae = os.path.join(model_dir, "sae")
        reconstruct = topk_reconstruct(write_topk_sae(sae, D, 96, 6, seed=9), 6)
        spec = {"model": {"huggingface": {"path": model_dir}}, "hookName": hook,
                "sae": {"path": sae}, "batchSequences": 3, "downstreamLossSequences": 5,
                "tokens": {"path": os.path.join(self.root, "tokens.npy"), "contextLength": CTX}}
        p, _ = run_extract_tool(TOOL, self.root, spec)
        self.assertEqual(p.returncode, 0, p.stderr)
        got = json.loads(p.stdout)["downstreamLoss"]

        # Five sequences spread over the shard: floor(i * S / 5) of its S.
        all_ids = torch.from_numpy(self.ids).view(-1, CTX)
        ids = all_ids[[i * len(all_ids) // 5 for i in range(5)]]
        with torch.no_grad():
            want = {"clean": self.last.loss(ids), "withSae": self.last.loss(ids, {hook: reconstruct}),
                    "zeroAblated": self.last.loss(ids, {hook: torch.zeros_like})}
        self.assertEqual(int(got["predictions"]), 5 * (CTX - 1))
        for key, value in want.items():
            self.assertAlmostEqual(got[key], value, delta=1e-4 * value, msg=key)
        self.assertNotAlmostEqual(want["withSae"], want["clean"], delta=1e-3)

    def test_llama_hooks_match(self):
        d, hooks = self.checkpoint("llama")
        for name in ["blocks.0.hook_attn_out", "blocks.1.attn.hook_z", "blocks.1.hook_resid_mid",
                     "blocks.1.mlp.hook_post", "blocks.1.ln2.hook_normalized", "blocks.1.mlp.hook_in",
                     "blocks.1.mlp.hook_out", "blocks.2.hook_resid_post"]:
            self.check(d, hooks, name)
        self.check(d, hooks, "blocks.1.hook_resid_post", as_name="model.layers.1")  # sparsify's name
        self.check_downstream_loss(d)  # lm_head, model.norm

    def test_llama3_rope_scaling_and_tied_embeddings(self):
        scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 64}
        d, hooks = self.checkpoint("llama3", tied=True, rope_scaling=scaling, rope_theta=10000.0)
        # the scaling changes the frequencies this test's sequences see
        self.assertFalse(torch.equal(inverse_frequencies({"head_dim": HEAD_DIM, "rope_theta": 1e4}),
                                     inverse_frequencies({"head_dim": HEAD_DIM, "rope_theta": 1e4,
                                                          "rope_scaling": scaling})))
        self.check(d, hooks, "blocks.2.hook_resid_post")

    def test_olmo2(self):
        d, hooks = self.checkpoint("olmo2", model_type="olmo2")
        for name in ["blocks.0.hook_attn_out", "blocks.1.hook_resid_mid", "blocks.1.hook_mlp_out",
                     "blocks.2.hook_resid_post"]:
            self.check(d, hooks, name)

    def test_phi3_fused_projections_longrope_and_partial_rotary(self):
        pairs = HEAD_DIM // 4  # half of each head rotates
        scaling = {"rope_type": "longrope", "short_factor": [1.0 + 0.5 * i for i in range(pairs)],
                   "long_factor": [2.0 + 3.0 * i for i in range(pairs)]}
        d, hooks = self.checkpoint("phi3", model_type="phi3", rope_scaling=scaling,
                                   partial_rotary_factor=0.5, original_max_position_embeddings=8,
                                   sliding_window=None)
        self.assertGreater(self.last.attention_factor(), 1.0)
        # Sequences of 16 positions outgrow the original 8: the long factors.
        self.check(d, hooks, "blocks.2.hook_resid_post")
        self.check(d, hooks, "blocks.1.mlp.hook_post")
        # Sequences of 8 keep the short ones.
        with torch.no_grad():
            short = self.last(torch.from_numpy(self.ids).view(-1, 8))["blocks.2.hook_resid_post"]
        p, out = self.run_tool(d, "blocks.2.hook_resid_post", context=8)
        assert_dense_rows(self, p, out, self.ids, short.reshape(len(self.ids), -1).numpy(),
                          "blocks.2.hook_resid_post at context 8")

    def test_qwen2_biases(self):
        d, hooks = self.checkpoint("qwen2", model_type="qwen2", qkv_bias=True)
        self.check(d, hooks, "blocks.1.hook_attn_out")
        self.check(d, hooks, "blocks.2.hook_resid_post")

    def test_gemma2(self):
        d, hooks = self.checkpoint("gemma2", model_type="gemma2", tied=True, seed=5, hidden_act="gelu",
                                   hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=24,
                                   attn_logit_softcapping=2.0, sliding_window=4096,
                                   final_logit_softcapping=30.0, rope_theta=10000.0)
        # the soft-capping acts on this model's scores
        plain = self.checkpoint("gemma2_nocap", model_type="gemma2", tied=True, seed=5, query_pre_attn_scalar=24,
                                attn_logit_softcapping=1e9, rope_theta=10000.0)[1]
        self.assertFalse(np.allclose(hooks["blocks.0.hook_attn_out"], plain["blocks.0.hook_attn_out"]))
        for name in ["blocks.0.hook_attn_out", "blocks.1.mlp.hook_post", "blocks.1.hook_mlp_out",
                     "blocks.1.ln2.hook_normalized", "blocks.1.mlp.hook_in", "blocks.1.mlp.hook_out",
                     "blocks.2.hook_resid_post"]:
            self.check(d, hooks, name)
        # mlp.hook_out is what the MLP returns, before Gemma 2's post-feedforward norm
        self.assertFalse(np.allclose(hooks["blocks.1.mlp.hook_out"], hooks["blocks.1.hook_mlp_out"]))
        self.checkpoint("gemma2", model_type="gemma2", tied=True, seed=5, hidden_act="gelu",
                        hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=24,
                        attn_logit_softcapping=2.0, sliding_window=4096,
                        final_logit_softcapping=3.0, rope_theta=10000.0)  # a cap that bites
        self.check_downstream_loss(d)  # tied, 1 + w, the final soft-cap
        # An SAE at ln2.hook_normalized: its reconstruction reaches the MLP through the norm's
        # gain (1 + w), as the model's own normalized input would.
        self.check_downstream_loss(d, hook="blocks.1.ln2.hook_normalized")

    def test_qwen3(self):
        d, hooks = self.checkpoint("qwen3", model_type="qwen3", tied=True, rope_theta=1e6)
        for name in ["blocks.0.hook_attn_out", "blocks.2.hook_resid_post"]:
            self.check(d, hooks, name)

    def gemma3(self, name, **changes):
        cfg = dict(model_type="gemma3_text", tied=True, seed=7, hidden_activation="gelu_pytorch_tanh",
                   query_pre_attn_scalar=24, sliding_window=5, rope_theta=1e6, rope_local_base_freq=1e4,
                   rope_scaling={"rope_type": "linear", "factor": 8.0}, max_position_embeddings=1024,
                   layer_types=["sliding_attention", "full_attention", "sliding_attention"])
        cfg.update(changes)
        return self.checkpoint(name, **cfg)

    def test_gemma3(self):
        d, hooks = self.gemma3("gemma3")
        # the 5-position window acts on this test's 16-position sequences
        wide = self.gemma3("gemma3_wide", sliding_window=64)[1]
        self.assertFalse(np.allclose(hooks["blocks.0.hook_attn_out"], wide["blocks.0.hook_attn_out"]))
        for name in ["blocks.0.hook_attn_out", "blocks.0.attn.hook_z", "blocks.1.hook_resid_mid",
                     "blocks.1.hook_mlp_out", "blocks.2.hook_resid_post"]:
            self.check(d, hooks, name)

    def test_gemma3_multimodal_checkpoint(self):
        # Gemma 3 4B and up ship as Gemma3ForConditionalGeneration: the language model's config
        # under text_config, its tensors under "language_model.model.", a vision tower beside
        # them. Here the sliding layers come from sliding_window_pattern (layers 0 and 2 slide).
        for layout in ["released", "resaved"]:
            d, hooks = self.gemma3("gemma3_multimodal_" + layout, layer_types=None,
                                   sliding_window_pattern=2, multimodal=layout)
            for name in ["blocks.0.hook_attn_out", "blocks.2.hook_resid_post"]:
                self.check(d, hooks, name)

    def test_gemma(self):
        # Gemma 1: the embedding scale, 1 + w gains and GeGLU, none of Gemma 2's additions; its
        # legacy hidden_act "gelu" is not what runs.
        d, hooks = self.checkpoint("gemma", model_type="gemma", tied=True, hidden_act="gelu",
                                   rope_theta=10000.0)
        self.check(d, hooks, "blocks.2.hook_resid_post")

    def neox_checkpoint(self, name, **config_changes):
        torch.manual_seed(9)
        g = lambda *shape, s=0.1: torch.randn(*shape) * s
        w = {"gpt_neox.embed_in.weight": g(VOCAB, D, s=1.0), "embed_out.weight": g(VOCAB, D),
             "gpt_neox.final_layer_norm.weight": 1 + g(D), "gpt_neox.final_layer_norm.bias": g(D)}
        for l in range(LAYERS):
            p = "gpt_neox.layers.%d." % l
            for n in ["input_layernorm", "post_attention_layernorm"]:
                w.update({p + n + ".weight": 1 + g(D), p + n + ".bias": g(D)})
            w.update({p + "attention.query_key_value.weight": g(3 * D, D),
                      p + "attention.query_key_value.bias": g(3 * D),
                      p + "attention.dense.weight": g(D, D), p + "attention.dense.bias": g(D),
                      p + "mlp.dense_h_to_4h.weight": g(FF, D), p + "mlp.dense_h_to_4h.bias": g(FF),
                      p + "mlp.dense_4h_to_h.weight": g(D, FF), p + "mlp.dense_4h_to_h.bias": g(D),
                      # buffers older Pythia checkpoints carry: not weights
                      p + "attention.bias": torch.ones(1, 1, 64, 64).tril(),
                      p + "attention.masked_bias": torch.tensor(-1e9),
                      p + "attention.rotary_emb.inv_freq": torch.ones(2)})
        cfg = {"architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox", "hidden_size": D,
               "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "intermediate_size": FF,
               "vocab_size": VOCAB, "max_position_embeddings": 64, "layer_norm_eps": 1e-5,
               "rotary_pct": 0.25, "rotary_emb_base": 10000, "hidden_act": "gelu",
               "use_parallel_residual": True, "tie_word_embeddings": False}
        cfg.update(config_changes)
        d = os.path.join(self.root, name)
        write_hf_checkpoint(d, cfg, w)
        self.last = Neox(w, cfg)
        with torch.no_grad():
            hooks = self.last(torch.from_numpy(self.ids).view(-1, CTX))
        return d, hooks

    def test_gpt_neox(self):
        d, hooks = self.neox_checkpoint("pythia")
        for name in ["blocks.0.hook_attn_out", "blocks.1.mlp.hook_post", "blocks.1.hook_mlp_out",
                     "blocks.1.ln2.hook_normalized", "blocks.1.mlp.hook_in", "blocks.1.mlp.hook_out",
                     "blocks.2.hook_resid_post"]:
            self.check(d, hooks, name)
        self.check(d, hooks, "blocks.1.hook_resid_post", as_name="gpt_neox.layers.1")
        p, _ = self.run_tool(d, "blocks.1.hook_resid_mid")
        self.assertIn("adds attention and MLP to the residual stream in parallel", p.stderr)
        # TransformerLens' center_writing_weights: the residual stream loses its per-token mean
        p, out = self.run_tool(d, "blocks.2.hook_resid_post", centered=True)
        plain = hooks["blocks.2.hook_resid_post"].reshape(len(self.ids), -1)
        assert_dense_rows(self, p, out, self.ids, (plain - plain.mean(-1, keepdim=True)).numpy(),
                          "centered blocks.2.hook_resid_post")
        d, hooks = self.neox_checkpoint("neox_sequential", use_parallel_residual=False, rotary_pct=0.5)
        for name in ["blocks.1.hook_resid_mid", "blocks.2.hook_resid_post"]:
            self.check(d, hooks, name)
        self.check_downstream_loss(d)  # final_layer_norm with its bias, embed_out

    def test_bfloat16(self):
        # dtype BFLOAT16: bfloat16 weights and matmuls, float32 norms and softmax, as Hugging Face
        # runs torch_dtype=bfloat16. Against the float32 reference: within bfloat16's precision
        # (8 bits of mantissa, three layers deep), and not equal to it (bfloat16 really ran).
        for d, hooks in [self.checkpoint("llama_bf16"), self.gemma3("gemma3_bf16"),
                         self.neox_checkpoint("pythia_bf16"),
                         self.checkpoint("olmo2_bf16", model_type="olmo2"),
                         self.checkpoint("phi3_bf16", model_type="phi3", partial_rotary_factor=0.5)]:
            for name in ["blocks.0.hook_attn_out", "blocks.2.hook_resid_post"]:
                p, out = self.run_tool(d, name, dtype="BFLOAT16")
                self.assertEqual(p.returncode, 0, p.stderr)
                got = np.load(os.path.join(out, "dense.npy"))
                want = hooks[name].reshape(len(self.ids), -1).numpy()
                err = np.abs(got - want).max() / np.abs(want).max()
                self.assertLess(err, 3e-2, "%s %s: %.3g" % (d, name, err))
                self.assertGreater(err, 1e-4, "%s %s ran in float32" % (d, name))
        p, _ = self.run_tool(d, "blocks.0.hook_resid_post", dtype="FLOAT16")
        self.assertIn("extract.model.huggingface.dtype: FLOAT16 is not supported", p.stderr)

    def test_bad_input_is_refused_at_submit(self):
        d, _ = self.checkpoint("llama_bad")
        p, _ = self.run_tool(d, "blocks.0.hook_resid_post", centered=True)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("center_writing_weights: for LayerNorm models only", p.stderr)
        p, _ = self.run_tool(d, "blocks.3.hook_resid_post")
        self.assertIn("layer 3 out of range, the llama model in", p.stderr)
        d, _ = self.checkpoint("mistral_window", model_type="mistral", sliding_window=8)
        p, _ = self.run_tool(d, "blocks.0.hook_resid_post")
        self.assertIn("extract.tokens.context_length: 16 > the model's context 8", p.stderr)


if __name__ == "__main__":
    unittest.main()
