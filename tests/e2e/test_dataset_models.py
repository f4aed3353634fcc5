"""GetLatentWeights and EncodePrompt through the daemon on a user's TorchScript model: a small
Hugging Face-style causal model (embedding, blocks, final norm, an untied lm_head) scripted with
python3-torch, an SAE in the SAELens layout, an EXTRACT with BOS prepended; then the latents'
direct logits and neighbours against numpy on the same weights, a prompt's latents against the
stored rows, and a model file changed after the dataset was made."""

import json
import os
import struct
import unittest

import grpc
import numpy
import torch

from harness import DaemonTestCase, assert_prompt_matches_rows
from latentd.v1 import jobs_pb2

VOCAB, D, LAYERS, CTX, D_SAE, K, BOS = 96, 32, 3, 16, 128, 8, 95


class CausalLM(torch.nn.Module):
    """Returns the hidden states (embeddings, then each block's output) as output_hidden_states
    does; causal, so a prefix's states do not depend on what follows it."""

    def __init__(self):
        super().__init__()
        self.wte = torch.nn.Embedding(VOCAB, D)
        self.wpe = torch.nn.Parameter(torch.randn(64, D) * 0.1)
        self.attn = torch.nn.ModuleList([torch.nn.Linear(D, D) for _ in range(LAYERS)])
        self.mlp = torch.nn.ModuleList(
            [torch.nn.Sequential(torch.nn.LayerNorm(D), torch.nn.Linear(D, 2 * D),
                                 torch.nn.GELU(), torch.nn.Linear(2 * D, D))
             for _ in range(LAYERS)])
        self.ln_f = torch.nn.LayerNorm(D)
        self.lm_head = torch.nn.Linear(D, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor):
        x = self.wte(tokens) + self.wpe[: tokens.shape[1]]
        hidden = [x]
        n = tokens.shape[1]
        causal = torch.tril(torch.ones(n, n)) / torch.arange(1, n + 1).unsqueeze(1)
        for attn, mlp in zip(self.attn, self.mlp):
            x = x + causal @ attn(x)  # mean over the prefix: a causal mixing
            x = x + mlp(x)
            hidden.append(x)
        return hidden


def write_sae(directory, w_enc, b_enc, w_dec, b_dec):
    os.makedirs(directory, exist_ok=True)
    header, blobs, offset = {}, [], 0
    for name, array in (("W_enc", w_enc), ("b_enc", b_enc), ("W_dec", w_dec), ("b_dec", b_dec)):
        data = numpy.ascontiguousarray(array, numpy.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(os.path.join(directory, "sae_weights.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    with open(os.path.join(directory, "cfg.json"), "w") as f:
        json.dump({"d_in": D, "d_sae": D_SAE, "architecture": "topk", "k": K,
                   "apply_b_dec_to_input": True}, f)


class DatasetModelsTest(DaemonTestCase):
    def test_weights_and_prompts_on_a_torchscript_model(self):
        torch.manual_seed(3)
        inputs = os.path.join(self.tmp, "inputs")
        os.makedirs(inputs)
        model = CausalLM().eval()
        model_path = os.path.join(inputs, "model.pt")
        torch.jit.script(model).save(model_path)
        rng = numpy.random.default_rng(4)
        numpy.save(os.path.join(inputs, "tokens.npy"),
                   rng.integers(0, VOCAB - 1, size=24 * CTX).astype(numpy.uint16))
        w_dec = rng.standard_normal((D_SAE, D)).astype(numpy.float32)
        w_dec /= numpy.linalg.norm(w_dec, axis=1, keepdims=True)
        w_dec[7] = w_dec[6] + 0.1 * w_dec[9]  # latent 7 nearly duplicates 6
        sae_dir = os.path.join(inputs, "sae")
        write_sae(sae_dir, w_dec.T * 2.0, numpy.full(D_SAE, -0.1, numpy.float32), w_dec,
                  numpy.zeros(D, numpy.float32))

        daemon = self.start_daemon(devices="cpu:1", extra_args=["--data_roots=" + self.tmp])
        c = daemon.client()
        job = c.wait(c.submit("EXTRACT", {
            "model": {"torchscript": {"path": model_path, "vocabSize": VOCAB}},
            "hookName": "hidden_states.2",
            "tokens": {"path": os.path.join(inputs, "tokens.npy"), "contextLength": CTX,
                       "prependBos": True, "bosTokenId": BOS},
            "sae": {"path": sae_dir}, "mode": "SPARSE", "datasetName": "ts"}).id)
        self.assertEqual(job.state, jobs_pb2.SUCCEEDED, job.message)
        dataset = job.result.extract.dataset_id

        # Direct logits through the untied head, and the nearest decoder directions.
        lm_head = model.lm_head.weight.detach().numpy()
        weights = c.latent_weights(dataset, 6, top_n=5)
        self.assertEqual(weights.logits_source, "lm_head.weight")
        logits = lm_head.astype(numpy.float64) @ w_dec[6]
        order = numpy.argsort(-logits, kind="stable")
        self.assertEqual([l.token_id for l in weights.positive_logits], order[:5].tolist())
        numpy.testing.assert_allclose([l.logit for l in weights.positive_logits],
                                      logits[order[:5]], rtol=1e-4, atol=1e-5)
        self.assertEqual([l.token_id for l in weights.negative_logits],
                         order[::-1][:5].tolist())
        self.assertEqual(weights.neighbors[0].latent, 7)
        unit = w_dec / numpy.linalg.norm(w_dec, axis=1, keepdims=True)
        self.assertAlmostEqual(weights.neighbors[0].cosine, float(unit[7] @ unit[6]), places=5)
        self.assertAlmostEqual(weights.encoder_decoder_cosine, 1.0, places=5)

        # A prompt: the first sequence's tokens after its BOS get the stored rows back.
        rows, tokens = c.read_rows(dataset, 0, CTX)
        self.assertEqual(int(tokens[0]), BOS)
        prompt = c.encode_prompt(dataset, tokens[1:], latents_per_token=K, top_latents=5)
        self.assertTrue(prompt.bos_prepended)
        self.assertEqual([t.token_id for t in prompt.tokens], tokens.tolist())
        assert_prompt_matches_rows(self, prompt, rows)
        # A prefix alone gets the same latents on its tokens (the model is causal).
        prefix = c.encode_prompt(dataset, tokens[1:5], latents_per_token=K)
        self.assertEqual([list(t.latents) for t in prefix.tokens],
                         [list(t.latents) for t in prompt.tokens[:5]])
        with self.assertRaises(grpc.RpcError) as bad:
            c.encode_prompt(dataset, [1, VOCAB])
        self.assertEqual(bad.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("token_ids[1]", bad.exception.details())

        # Text instead of ids: a tokenizer.json (BPE over letters, space and ".", merges
        # t+h, th+e, " "+the, i+n, in that rank order) through latentctl tokenize and
        # prompt --text. By hand: "the cat in the hat." is the | " " c a t | " " in | " the" |
        # " " h a t | ".".
        letters = list("abcdefghijklmnopqrstuvwxyz .")
        vocab = {ch: i for i, ch in enumerate(letters)}
        vocab.update({"th": 28, "the": 29, " the": 30, "in": 31})
        tokenizer = os.path.join(inputs, "tokenizer.json")
        with open(tokenizer, "w") as f:
            json.dump({"model": {"type": "BPE", "vocab": vocab,
                                 "merges": [["t", "h"], ["th", "e"], [" ", "the"],
                                            ["i", "n"]]}}, f)
        text = "the cat in the hat."
        ids = [29, 26, 2, 0, 19, 26, 31, 30, 26, 7, 0, 19, 27]
        got = json.loads(daemon.latentctl("--json", "prompt", str(dataset), "--text=" + text,
                                          "--vocab=" + tokenizer, "--limit=5").stdout)
        self.assertEqual([int(t.get("tokenId", 0)) for t in got["tokens"]], [BOS] + ids)
        want = c.encode_prompt(dataset, ids, latents_per_token=5, top_latents=5)
        self.assertEqual([int(l["latent"]) for l in got["topLatents"]],
                         [l.latent for l in want.top_latents])
        # The same text as a document file, ten times over -> a token stream an EXTRACT reads.
        doc = os.path.join(inputs, "story.txt")
        with open(doc, "w") as f:
            f.write(" ".join([text] * 10))
        stream = os.path.join(inputs, "story.npy")
        daemon.latentctl("tokenize", doc, "--vocab=" + tokenizer, "--out=" + stream,
                         "--separator=.")
        stream_ids = numpy.load(stream)
        self.assertEqual(stream_ids.dtype, numpy.uint16)
        # Each later sentence's joining space merges into " the"; "." is appended.
        self.assertEqual(stream_ids.tolist(), ids + ([30] + ids[1:]) * 9 + [27])
        story = c.wait(c.submit("EXTRACT", {
            "model": {"torchscript": {"path": model_path, "vocabSize": VOCAB}},
            "hookName": "hidden_states.2",
            "tokens": {"path": stream, "contextLength": CTX, "prependBos": True,
                       "bosTokenId": BOS},
            "sae": {"path": sae_dir}, "mode": "SPARSE", "datasetName": "story"}).id)
        self.assertEqual(story.state, jobs_pb2.SUCCEEDED, story.message)
        _, story_tokens = c.read_rows(story.result.extract.dataset_id, 0, CTX)
        self.assertEqual(story_tokens.tolist(), [BOS] + stream_ids[:CTX - 1].tolist())

        # The model file changes after the dataset was made: the daemon keeps serving the
        # weights it verified while they stay cached; after a restart that keeps none
        # (--dataset_models_cache_mb=0) the neighbours still come, the logits do not, and a
        # prompt is refused rather than encoded by other weights.
        torch.manual_seed(5)
        torch.jit.script(CausalLM().eval()).save(model_path)
        self.assertEqual(c.latent_weights(dataset, 6, top_n=5).logits_source, "lm_head.weight")
        daemon.stop()
        daemon.extra_args.append("--dataset_models_cache_mb=0")
        daemon.start()
        c = daemon.client()
        weights = c.latent_weights(dataset, 6, top_n=5)
        self.assertEqual(weights.neighbors[0].latent, 7)
        self.assertEqual(len(weights.positive_logits), 0)
        self.assertIn("changed since the dataset was made", weights.logits_unavailable)
        self.assertEqual(c.latent_weights(dataset, 6).logits_unavailable,
                         weights.logits_unavailable)
        with self.assertRaises(grpc.RpcError) as changed:
            c.encode_prompt(dataset, tokens[1:4])
        self.assertEqual(changed.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
        self.assertIn("the model changed", changed.exception.details())


if __name__ == "__main__":
    unittest.main()
