"""Parity of latentd's EXTRACT with the same model and SAE run in Python (python3-torch).

Builds a small TorchScript model whose forward returns the hidden states (as a Hugging Face model
with output_hidden_states=True does), an SAE in the SAELens layout (safetensors + cfg.json), and
uint16 tokens; runs engine/extract_tool (RunExtract into a real chunk store, rows read back), and
compares with Python: the same latent index set per row (a swap at a tie within 1e-5 of the k-th
pre-activation, or of a JumpReLU threshold or a gate's zero, is allowed and counted), values within
fp16 tolerance, identical token ids.
"""
import json
import os
import sys
import tempfile
import unittest
import zlib

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from extract_test_util import run_extract_tool, write_safetensors  # noqa: E402

VOCAB, D, LAYERS, CTX, D_SAE, K = 100, 32, 3, 16, 128, 8
TOOL = os.environ["EXTRACT_TOOL"]


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, D)
        self.pos = torch.nn.Parameter(torch.randn(64, D) * 0.1)
        self.blocks = torch.nn.ModuleList(
            [torch.nn.Sequential(torch.nn.LayerNorm(D), torch.nn.Linear(D, 4 * D), torch.nn.GELU(),
                                 torch.nn.Linear(4 * D, D)) for _ in range(LAYERS)])

    def forward(self, tokens: torch.Tensor):
        x = self.emb(tokens) + self.pos[: tokens.shape[1]]
        hidden = [x]
        for block in self.blocks:
            x = x + block(x)
            hidden.append(x)
        return hidden


class ExtractParityTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        torch.manual_seed(0)
        cls.root = tempfile.mkdtemp(prefix="parity-")
        cls.model = Tiny().eval()
        torch.jit.script(cls.model).save(os.path.join(cls.root, "model.pt"))
        rng = np.random.default_rng(1)
        # Zipf-like ids, 37 sequences (a partial last batch) plus a trailing partial sequence.
        ids = np.minimum(rng.zipf(1.3, size=37 * CTX + 5) - 1, VOCAB - 1).astype(np.uint16)
        np.save(os.path.join(cls.root, "tokens.npy"), ids)
        cls.ids = ids[: 37 * CTX].astype(np.int64)
        with torch.no_grad():
            cls.hidden = [h.reshape(-1, D) for h in cls.model(torch.from_numpy(cls.ids).view(-1, CTX))]

    def make_sae(self, name, architecture, apply_b_dec=True):
        d = os.path.join(self.root, name)
        os.makedirs(d, exist_ok=True)
        # crc32, not hash(): str hashes are salted per process, and a test's weights must not be.
        g = torch.Generator().manual_seed(zlib.crc32(name.encode()) % 1000)
        w_dec = torch.randn(D_SAE, D, generator=g)
        w_dec = w_dec / w_dec.norm(dim=1, keepdim=True)
        w = {"W_enc": w_dec.t().clone(), "b_enc": torch.randn(D_SAE, generator=g) * 0.1,
             "W_dec": w_dec, "b_dec": torch.randn(D, generator=g) * 0.05}
        cfg = {"d_in": D, "d_sae": D_SAE, "architecture": architecture,
               "apply_b_dec_to_input": apply_b_dec, "hook_name": "hidden_states.2"}
        if architecture == "topk":
            cfg["k"] = K
        if architecture == "jumprelu":
            w["threshold"] = torch.rand(D_SAE, generator=g) * 0.5
        if architecture == "gated":  # SAELens' GatedSAE: b_gate in place of b_enc
            w["b_gate"] = w.pop("b_enc")
            w["r_mag"] = torch.randn(D_SAE, generator=g) * 0.3
            w["b_mag"] = torch.randn(D_SAE, generator=g) * 0.1 - 0.05
        write_safetensors(os.path.join(d, "sae_weights.safetensors"), w)
        with open(os.path.join(d, "cfg.json"), "w") as f:
            json.dump(cfg, f)
        return d, w, cfg

    def run_tool(self, spec, devices=1, expect_ok=True):
        p, out = run_extract_tool(TOOL, self.root, spec, devices)
        if not expect_ok:
            return p
        self.assertEqual(p.returncode, 0, p.stderr)
        got = {name[:-4]: np.load(os.path.join(out, name)) for name in os.listdir(out)}
        got["result"] = json.loads(p.stdout)  # the job's ExtractResult, protobuf JSON mapping
        return got

    def spec(self, hook, sae_dir=None, **extra):
        s = {"model": {"torchscript": {"path": os.path.join(self.root, "model.pt"), "vocabSize": VOCAB}},
             "hookName": hook,
             "tokens": {"path": os.path.join(self.root, "tokens.npy"), "contextLength": CTX},
             "batchSequences": 5, "commitRows": 100}
        if sae_dir:
            s["sae"] = {"path": sae_dir}
        s.update(extra)
        return s

    @staticmethod
    def encode(x, w, cfg):
        """(z, pre, fired) as SAELens encodes x: TopK keeps the k largest pre, then ReLU; Gated
        multiplies the gate (pre_gate > 0) into the ReLU of the magnitude path (pre is then
        pre_gate). fired is what each latent holds where it fires: pre, or the magnitude."""
        with torch.no_grad():
            inp = x - w["b_dec"] if cfg["apply_b_dec_to_input"] else x
            if cfg["architecture"] == "gated":
                pre = inp @ w["W_enc"] + w["b_gate"]
                magnitude = (inp @ (w["W_enc"] * w["r_mag"].exp()) + w["b_mag"]).relu()
                return magnitude * (pre > 0), pre, magnitude
            pre = inp @ w["W_enc"] + w["b_enc"]
            if cfg["architecture"] == "topk":
                top = pre.topk(K, dim=1)
                return torch.zeros_like(pre).scatter(1, top.indices, top.values.relu()), pre, pre
            return pre * (pre > w["threshold"]), pre, pre

    def check_sparse(self, got, x, w, cfg):
        np.testing.assert_array_equal(got["token_ids"], self.ids)
        z, pre, fired = (t.numpy() for t in self.encode(x, w, cfg))
        indptr, indices, values = got["indptr"], got["indices"], got["values"]
        self.assertEqual(len(indptr), len(self.ids) + 1)
        swaps = 0
        for r in range(len(self.ids)):
            row_idx = indices[indptr[r]:indptr[r + 1]]
            row_val = values[indptr[r]:indptr[r + 1]]
            p = pre[r]
            # The value each latent's pre-activation is compared with to decide whether it fires:
            # the row's k-th largest (TopK), the latent's threshold (JumpReLU), 0 (the gate).
            if cfg["architecture"] == "topk":
                top = np.argsort(-p, kind="stable")[:K]
                want = set(int(j) for j in top if p[j] > 0)
                boundary = np.full_like(p, p[top[-1]])
            else:
                want = set(int(j) for j in np.nonzero(z[r])[0])
                boundary = (w["threshold"].numpy() if cfg["architecture"] == "jumprelu"
                            else np.zeros_like(p))
            got_set = set(int(j) for j in row_idx)
            self.assertEqual(len(got_set), len(row_idx), "duplicate index in row %d" % r)
            for j in got_set ^ want:
                # Summation order differs between LibTorch's matmul and numpy's, so a latent
                # within 1e-5 of its boundary may land on either side; farther is a real bug.
                self.assertLessEqual(abs(p[j] - boundary[j]), 1e-5,
                                     "row %d: latent %d differs and is no tie (pre %.7g, boundary "
                                     "%.7g)" % (r, j, p[j], boundary[j]))
                swaps += 1
            for j, v in zip(row_idx, row_val):
                ref = fired[r][j]
                self.assertLessEqual(abs(v - ref), 2e-3 * abs(ref) + 1e-4, "row %d latent %d" % (r, j))
        return swaps

    def check_fit(self, fit, x, w, cfg):
        """The SAE's fit as latentd reports it against the SAELens-style figures from x and
        x_hat = z W_dec + b_dec, z encoded here."""
        z, _, _ = self.encode(x, w, cfg)
        with torch.no_grad():
            self.check_fit_of(fit, x, z @ w["W_dec"] + w["b_dec"])

    def check_fit_of(self, fit, x, x_hat):
        with torch.no_grad():
            x64, h64 = x.double(), x_hat.double()
            sse = ((x64 - h64) ** 2).sum().item()
            sst = ((x64 - x64.mean(0)) ** 2).sum().item()
            cos = torch.nn.functional.cosine_similarity(x64, h64, dim=1).mean().item()
        self.assertEqual(int(fit["rows"]), x.shape[0])
        self.assertAlmostEqual(fit["explainedVariance"], 1 - sse / sst, delta=1e-4)
        self.assertAlmostEqual(fit["mse"], sse / x.numel(), delta=1e-4 * sse / x.numel())
        self.assertAlmostEqual(fit["cosineSimilarity"], cos, delta=1e-4)

    def test_topk_sparse_two_devices_matches_python(self):
        d, w, cfg = self.make_sae("sae_topk", "topk")
        got = self.run_tool(self.spec("hidden_states.2", d), devices=2)
        swaps = self.check_sparse(got, self.hidden[2], w, cfg)
        self.check_fit(got["result"]["fit"], self.hidden[2], w, cfg)
        print("topk: rows %d, nnz %d, tie swaps %d" % (len(self.ids), len(got["indices"]), swaps),
              file=sys.stderr)

    def test_two_hooks_of_one_forward_match_python(self):
        # One job, the TorchScript model's forward once per batch: hidden_states.2 through a TopK
        # SAE (the rows, written out) and blocks.0.hook_resid_post (hidden_states[1]) through a
        # JumpReLU SAE (its dataset's fit, in the result).
        d_topk, w_topk, cfg_topk = self.make_sae("sae_topk2", "topk")
        d_jump, w_jump, cfg_jump = self.make_sae("sae_jump2", "jumprelu")
        spec = self.spec("hidden_states.2", d_topk,
                         moreOutputs=[{"hookName": "blocks.0.hook_resid_post",
                                       "sae": {"path": d_jump}}])
        got = self.run_tool(spec)
        self.check_sparse(got, self.hidden[2], w_topk, cfg_topk)
        self.check_fit(got["result"]["fit"], self.hidden[2], w_topk, cfg_topk)
        more = got["result"]["moreOutputs"]
        self.assertEqual(len(more), 1)
        self.assertEqual(more[0]["hookName"], "blocks.0.hook_resid_post")
        self.assertEqual(int(more[0]["rows"]), len(self.ids))
        self.check_fit(more[0]["fit"], self.hidden[1], w_jump, cfg_jump)

    def test_jumprelu_without_b_dec_matches_python(self):
        d, w, cfg = self.make_sae("sae_jump", "jumprelu", apply_b_dec=False)
        # blocks.0.hook_resid_post is hidden_states[1]
        got = self.run_tool(self.spec("blocks.0.hook_resid_post", d))
        self.check_sparse(got, self.hidden[1], w, cfg)
        self.check_fit(got["result"]["fit"], self.hidden[1], w, cfg)

    def test_gated_matches_python(self):
        d, w, cfg = self.make_sae("sae_gated", "gated")
        got = self.run_tool(self.spec("hidden_states.2", d))
        self.check_sparse(got, self.hidden[2], w, cfg)
        self.check_fit(got["result"]["fit"], self.hidden[2], w, cfg)
        self.assertGreater(len(got["indices"]), 0)

    def test_gemma_scope_params_npz_matches_python(self):
        # Gemma Scope's release layout: params.npz and no cfg.json, under
        # <release>-res/layer_L/width_N/average_l0_M; a JumpReLU SAE without b_dec subtraction.
        # Written by numpy.savez and by savez_compressed (deflate).
        _, w, cfg = self.make_sae("sae_jump_scope", "jumprelu", apply_b_dec=False)
        arrays = {k: v.numpy() for k, v in w.items()}
        for save in (np.savez, np.savez_compressed):
            d = os.path.join(self.root, "gemma-scope-tiny-res", "layer_1", "width_128",
                             "average_l0_%s" % save.__name__)
            os.makedirs(d, exist_ok=True)
            save(os.path.join(d, "params.npz"), **arrays)
            # blocks.1.hook_resid_post (from the path) is hidden_states[2]: no warning
            p, out = run_extract_tool(TOOL, self.root, self.spec("hidden_states.2", d))
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertNotIn("was trained on hook", p.stderr)
            got = {name[:-4]: np.load(os.path.join(out, name)) for name in os.listdir(out)}
            self.check_sparse(got, self.hidden[2], w, cfg)
            self.check_fit(json.loads(p.stdout)["fit"], self.hidden[2], w, cfg)
        # the wrong layer is caught from the path
        p, _ = run_extract_tool(TOOL, self.root, self.spec("hidden_states.1", d))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("its SAE was trained on hook blocks.1.hook_resid_post", p.stderr)
        # -att releases are SAEs of the attention heads' outputs before the output projection
        att = os.path.join(self.root, "gemma-scope-tiny-att", "layer_1", "width_128", "average_l0_5")
        os.makedirs(att, exist_ok=True)
        np.savez(os.path.join(att, "params.npz"), **arrays)
        p, _ = run_extract_tool(TOOL, self.root, self.spec("hidden_states.2", att))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("its SAE was trained on hook blocks.1.attn.hook_z", p.stderr)
        # a damaged archive is refused at submit, naming it
        with open(os.path.join(d, "params.npz"), "r+b") as f:
            f.truncate(os.path.getsize(os.path.join(d, "params.npz")) // 2)
        p, _ = run_extract_tool(TOOL, self.root, self.spec("hidden_states.2", d))
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("params.npz: not a zip file", p.stderr)

    def test_llama_scope_layout_matches_lm_saes(self):
        # lm-saes' layout, as Llama Scope ships its SAEs: hyperparams.json and
        # checkpoints/final.safetensors with nn.Linear weights. lm-saes scales the input to mean
        # norm sqrt(d_model), and a latent fires where pre times its decoder direction's norm
        # passes the one threshold; the stored values are pre itself.
        g = torch.Generator().manual_seed(21)
        enc = torch.randn(D_SAE, D, generator=g) / D ** 0.5
        dec = torch.randn(D, D_SAE, generator=g) / D ** 0.5
        dec = dec * (torch.rand(D_SAE, generator=g) * 1.7 + 0.3)  # unequal direction norms
        w = {"encoder.weight": enc, "encoder.bias": torch.randn(D_SAE, generator=g) * 0.2,
             "decoder.weight": dec, "decoder.bias": torch.randn(D, generator=g) * 0.05}
        x = self.hidden[2]
        mean_norm = x.norm(dim=1).mean().item()
        hp = {"d_model": D, "expansion_factor": D_SAE // D, "d_sae": D_SAE,
              "hook_point_in": "blocks.1.hook_resid_post",
              "hook_point_out": "blocks.1.hook_resid_post", "act_fn": "jumprelu",
              "jump_relu_threshold": 0.4, "top_k": 50, "norm_activation": "dataset-wise",
              "dataset_average_activation_norm": {"in": mean_norm, "out": mean_norm},
              "use_decoder_bias": True, "apply_decoder_bias_to_pre_encoder": False,
              "sparsity_include_decoder_norm": True}
        d = os.path.join(self.root, "Llama3_1-8B-Base-L1R-4x")
        os.makedirs(os.path.join(d, "checkpoints"), exist_ok=True)
        write_safetensors(os.path.join(d, "checkpoints", "final.safetensors"), w)
        with open(os.path.join(d, "hyperparams.json"), "w") as f:
            json.dump(hp, f)
        # blocks.1.hook_resid_post is hidden_states[2]: no warning
        p, out = run_extract_tool(TOOL, self.root, self.spec("hidden_states.2", d))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertNotIn("was trained on hook", p.stderr)
        got = {name[:-4]: np.load(os.path.join(out, name)) for name in os.listdir(out)}
        np.testing.assert_array_equal(got["token_ids"], self.ids)
        with torch.no_grad():
            scale = D ** 0.5 / mean_norm
            pre = (x.double() * scale) @ enc.double().t() + w["encoder.bias"].double()
            score = pre * dec.double().norm(dim=0)
            z = pre * (score > 0.4)
            x_hat = (z @ dec.double().t() + w["decoder.bias"].double()) / scale
        z, score = z.numpy(), score.numpy()
        indptr, indices, values = got["indptr"], got["indices"], got["values"]
        near = 0
        for r in range(len(self.ids)):
            row = slice(indptr[r], indptr[r + 1])
            want = set(int(j) for j in np.nonzero(z[r])[0])
            for j in set(int(j) for j in indices[row]) ^ want:
                self.assertLess(abs(score[r, j] - 0.4), 1e-4, "row %d: latent %d differs" % (r, j))
                near += 1
            for j, v in zip(indices[row], values[row]):
                if z[r, j] != 0:
                    self.assertLessEqual(abs(v - z[r, j]), 2e-3 * abs(z[r, j]) + 1e-4,
                                         "row %d latent %d" % (r, j))
        nnz = len(indices)
        self.assertGreater(nnz, len(self.ids))  # several latents a row, not all of them
        self.assertLess(nnz, len(self.ids) * D_SAE // 2)
        self.check_fit_of(json.loads(p.stdout)["fit"], x, x_hat)
        print("llama scope: rows %d, nnz %d, at the threshold %d" % (len(self.ids), nnz, near),
              file=sys.stderr)
        # A transcoder of the same release is refused at submit, naming why.
        hp["hook_point_out"] = "blocks.1.hook_mlp_out"
        with open(os.path.join(d, "hyperparams.json"), "w") as f:
            json.dump(hp, f)
        p, _ = run_extract_tool(TOOL, self.root, self.spec("hidden_states.2", d))
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("transcoder", p.stderr)

    def test_dense_fp32_stores_the_hidden_states(self):
        got = self.run_tool(self.spec("hidden_states.3", mode="DENSE", valueDtype="FLOAT32"))
        np.testing.assert_array_equal(got["token_ids"], self.ids)
        np.testing.assert_allclose(got["dense"], self.hidden[3].numpy(), rtol=1e-5, atol=1e-5)

    def test_bad_input_is_reported(self):
        d, _, _ = self.make_sae("sae_topk", "topk")
        small_vocab = self.spec("hidden_states.2", d)
        small_vocab["model"]["torchscript"]["vocabSize"] = 5
        p = self.run_tool(small_vocab, expect_ok=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("vocab_size", p.stderr)
        p = self.run_tool(self.spec("hidden_states.9", d), expect_ok=False)
        self.assertIn("out of range", p.stderr)
        p = self.run_tool(self.spec("hidden_states.2", "/etc"), expect_ok=False)
        self.assertIn("PERMISSION_DENIED", p.stderr)


if __name__ == "__main__":
    unittest.main()
