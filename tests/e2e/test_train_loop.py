"""The loop users need, through the daemon: extract DENSE hidden states of the reference model ->
train a TopK SAE on them with smfac -> extract SPARSE latents with the trained SAE -> GetLatent."""

import json
import os
import re
import struct
import subprocess
import sys
import unittest

import grpc
import numpy
import scipy.sparse

from harness import DaemonTestCase, assert_prompt_matches_rows
from latentd_client import Crosscoder, delphi_explanations
from latentd.v1 import datasets_pb2, jobs_pb2

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts")
MODEL = {"reference": {"dModel": 64, "nLayers": 2, "nHeads": 4, "dMlp": 256, "vocabSize": 4096,
                       "contextLength": 32, "seed": 1}}


SAFETENSORS_DTYPES = {"F32": numpy.float32, "I32": numpy.int32, "I64": numpy.int64}


def read_safetensors(path):
    """{name: array} of a safetensors file of F32 (and I32, I64) tensors."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        assert info["dtype"] in SAFETENSORS_DTYPES, info
        out[name] = numpy.frombuffer(data[8 + n + begin:8 + n + end],
                                     SAFETENSORS_DTYPES[info["dtype"]]).reshape(info["shape"])
    return out


def rows_before(client, dataset_id, row):
    """Entries in rows [0, row)."""
    return client.read_rows(dataset_id, 0, row)[0].nnz


class TrainLoop(DaemonTestCase):
    def inputs_and_daemon(self, devices="cpu:1"):
        """Demo inputs (64 sequences of 32 tokens, an SAE 64 -> 256) and a latentd."""
        inputs = os.path.join(self.tmp, "inputs")
        subprocess.run([sys.executable, os.path.join(SCRIPTS, "make_demo_inputs.py"), inputs,
                        "--sequences", "64", "--context", "32", "--d_in", "64", "--d_sae", "256",
                        "--k", "8"], check=True, capture_output=True)
        daemon = self.start_daemon(devices=devices, extra_args=["--data_roots=" + self.tmp])
        return inputs, daemon

    def train_stored_and_live(self, train, devices="cpu:1"):
        """Trains `train` on the reference model's blocks.1.hook_resid_post twice: on a DENSE
        dataset of it and on the model's activations (train.activations), with every device.
        Checks that both succeed with SAEs equal up to float rounding (the same rows in the same
        order; the forward passes batch the sequences differently) and returns (client, source,
        stored job, live job, the live job's log)."""
        inputs, daemon = self.inputs_and_daemon(devices)
        c = daemon.client()
        num_devices = int(devices.split(":")[1])
        source = {"model": MODEL, "hookName": "blocks.1.hook_resid_post",
                  "tokens": {"path": os.path.join(inputs, "tokens.npy"), "contextLength": 32}}
        dense = c.wait(c.submit("EXTRACT", dict(source, mode="DENSE", valueDtype="FLOAT32")).id)
        self.assertEqual(dense.state, jobs_pb2.SUCCEEDED, dense.message)
        stored = c.wait(c.submit("TRAIN", dict(
            train, datasetId=str(dense.result.extract.dataset_id), artifactName="stored"),
            num_devices=num_devices).id)
        live = c.wait(c.submit("TRAIN", dict(train, activations=source, artifactName="live"),
                               num_devices=num_devices).id)
        for job in (stored, live):
            self.assertEqual(job.state, jobs_pb2.SUCCEEDED, job.message)
        weights = [read_safetensors(os.path.join(job.result.train.artifact_path,
                                                 "sae_weights.safetensors"))
                   for job in (stored, live)]
        for name in weights[0]:
            numpy.testing.assert_allclose(weights[1][name], weights[0][name], rtol=1e-4,
                                          atol=1e-5, err_msg=name)
        log = "\n".join(e.log.text for e in c.watch(live.id) if e.HasField("log"))
        return c, source, stored, live, log

    def dense_dataset(self, c, inputs, **extra):
        """A float32 DENSE dataset of blocks.1.hook_resid_post over the inputs' tokens: (the
        tokens' spec, the finished EXTRACT job)."""
        tokens = {"path": os.path.join(inputs, "tokens.npy"), "contextLength": 32}
        dense = c.wait(c.submit("EXTRACT", dict({
            "model": MODEL, "hookName": "blocks.1.hook_resid_post", "tokens": tokens,
            "mode": "DENSE", "valueDtype": "FLOAT32"}, **extra)).id)
        self.assertEqual(dense.state, jobs_pb2.SUCCEEDED, dense.message)
        return tokens, dense

    def test_extract_train_extract_query(self):
        inputs, daemon = self.inputs_and_daemon()
        c = daemon.client()
        tokens, dense = self.dense_dataset(c, inputs, datasetName="dense")
        dense_id = dense.result.extract.dataset_id
        info = c.datasets.GetDataset(datasets_pb2.GetDatasetRequest(dataset_id=dense_id))
        self.assertEqual(info.kind, datasets_pb2.DENSE_ACTIVATIONS)
        self.assertEqual(info.d_in, 64)

        train = c.submit("TRAIN", {
            "datasetId": str(dense_id),
            "sae": {"architecture": "TOPK", "dSae": 256, "k": 8},
            "optimizer": {"name": "smfac", "lr": 3e-3, "damp": 1e-4, "window": 16,
                          "density": 0.05},
            "schedule": {"kind": "COSINE", "warmupSteps": 5},
            "batchSize": 64, "steps": 120, "seed": 5, "checkpointEvery": 40,
            "telemetryEvery": 10, "artifactName": "loop-sae"})
        events = list(c.watch(train.id))
        trained = c.get(train.id)
        self.assertEqual(trained.state, jobs_pb2.SUCCEEDED, trained.message)
        samples = [e.telemetry.train for e in events
                   if e.HasField("telemetry") and e.telemetry.HasField("train")]
        self.assertGreaterEqual(len(samples), 10)
        self.assertLess(samples[-1].loss, samples[0].loss)
        for s in samples:
            self.assertEqual(s.optimizer_state_total_bytes, sum(s.optimizer_state_bytes.values()))
            self.assertGreater(s.dense_mfac_history_bytes, s.optimizer_state_total_bytes)
        self.assertEqual(trained.result.train.steps, 120)
        # The Python client hands the same samples over as plain numbers.
        series = c.train_telemetry(train.id)
        self.assertEqual([s["step"] for s in series], [s.step for s in samples])
        self.assertEqual([s["loss"] for s in series], [s.loss for s in samples])
        self.assertEqual(series[-1]["optimizer_state_bytes"],
                         dict(samples[-1].optimizer_state_bytes))
        self.assertEqual(series[-1]["prefix_fvu"], {})  # a plain SAE
        # latentctl reads the kept telemetry after the job ended: a table and a PNG plot.
        plot = os.path.join(self.tmp, "train.png")
        table = daemon.latentctl("telemetry", str(train.id), "--plot=" + plot).stdout
        rows = [line for line in table.splitlines() if line.split() and line.split()[0].isdigit()]
        self.assertEqual(len(rows), len(samples))
        self.assertEqual(int(rows[-1].split()[0]), 120)
        with open(plot, "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
        self.assertGreater(os.path.getsize(plot), 10000)
        artifact = trained.result.train.artifact_id
        self.assertGreater(artifact, 0)

        sparse = c.wait(c.submit("EXTRACT", {
            "model": MODEL, "hookName": "blocks.1.hook_resid_post", "tokens": tokens,
            "sae": {"artifactId": str(artifact)}, "mode": "SPARSE", "datasetName": "sparse",
            "downstreamLossSequences": 8}).id)
        self.assertEqual(sparse.state, jobs_pb2.SUCCEEDED, sparse.message)
        # The model's loss with the trained SAE spliced in, after the rows; latentctl shows it.
        downstream = sparse.result.extract.downstream_loss
        self.assertEqual(downstream.predictions, 8 * 31)
        self.assertGreater(downstream.clean, 0)
        self.assertNotEqual(downstream.with_sae, downstream.clean)
        self.assertIn("  loss     next-token cross-entropy %.4f, with the SAE %.4f" % (
            downstream.clean, downstream.with_sae),
            daemon.latentctl("get", str(sparse.id)).stdout)
        # How well the trained SAE reconstructs the hook, measured by EXTRACT over every row,
        # agrees with what training measured on its last batches.
        fit = sparse.result.extract.fit
        self.assertEqual(fit.rows, 64 * 32)
        self.assertGreater(fit.explained_variance, 0.3)
        self.assertAlmostEqual(fit.explained_variance, 1 - trained.result.train.final_fvu,
                               delta=0.1)
        self.assertGreater(fit.cosine_similarity, 0.5)
        # The dataset keeps the figures (with its commits), for anyone who lists it later.
        kept = c.get_dataset(sparse.result.extract.dataset_id).fit
        self.assertEqual(kept.rows, fit.rows)
        self.assertAlmostEqual(kept.explained_variance, fit.explained_variance, places=12)
        listed = daemon.latentctl("datasets").stdout
        self.assertIn("SAE EV", listed)
        self.assertIn("%.4f" % fit.explained_variance, listed)
        line = next(l for l in listed.splitlines()
                    if l.startswith("%-5d " % sparse.result.extract.dataset_id))
        self.assertIn(" topk 8 ", line)  # the encoder that made the latents
        rows, _ = c.read_rows(sparse.result.extract.dataset_id, 0, 4)
        self.assertEqual(rows.shape[1], 256)
        # Packed pieces (numpy.frombuffer of 16-bit words) and repeated fields give the same rows.
        dataset = sparse.result.extract.dataset_id
        packed, packed_tokens = c.read_rows(dataset, 3, 0)
        plain, plain_tokens = c.read_rows(dataset, 3, 0, packed=False)
        self.assertGreater(packed.nnz, 0)
        self.assertEqual(packed.dtype, plain.dtype)
        self.assertEqual((packed != plain).nnz, 0)
        self.assertTrue((packed.indptr == plain.indptr).all())
        self.assertTrue((packed_tokens == plain_tokens).all())
        # What the trained SAE's weights say about a latent: its nearest decoder directions
        # (numpy on the artifact's safetensors agrees) and its direct logits through the
        # reference model's tied embedding.
        listed = c.list_artifacts()
        w_dec = read_safetensors(os.path.join(listed[0].path, "sae_weights.safetensors"))["W_dec"]
        unit = w_dec / numpy.maximum(numpy.linalg.norm(w_dec, axis=1, keepdims=True), 1e-30)
        cosines = unit @ unit[5]
        cosines[5] = -numpy.inf
        weights = c.latent_weights(dataset, 5, top_n=6)
        self.assertEqual([n.latent for n in weights.neighbors],
                         sorted(range(256), key=lambda j: (-cosines[j], j))[:6])
        numpy.testing.assert_allclose([n.cosine for n in weights.neighbors],
                                      numpy.sort(cosines)[::-1][:6], atol=1e-5)
        self.assertAlmostEqual(weights.decoder_norm, float(numpy.linalg.norm(w_dec[5])), places=4)
        self.assertEqual(weights.logits_source, "embed.W_E (tied)")
        up = [l.logit for l in weights.positive_logits]
        down = [l.logit for l in weights.negative_logits]
        self.assertEqual((len(up), len(down)), (6, 6))
        self.assertEqual(up, sorted(up, reverse=True))
        self.assertEqual(down, sorted(down))
        self.assertGreater(up[-1], down[-1])
        view = c.show_latent(dataset, 5, decode=lambda ids: ["<%d>" % i for i in ids], top_n=1,
                             weights=True, silent_samples=2, silent_seed=3)
        shown_html = view._repr_html_()
        self.assertEqual(len(view.answer.silent), 2)
        self.assertIn("silent windows: it fires on no token", shown_html)
        self.assertEqual([e.row for e in view.answer.silent],
                         [e.row for e in c.get_latent(dataset, 5, silent_samples=2,
                                                      silent_seed=3).silent])
        self.assertIn("raises: <code>&lt;%d&gt;</code>" % view.weights.positive_logits[0].token_id,
                      shown_html)
        self.assertIn("nearest decoder directions: %d (" % weights.neighbors[0].latent, shown_html)
        shown = daemon.latentctl("weights", str(dataset), "5", "--limit=3").stdout
        self.assertIn("direct logits through embed.W_E (tied)", shown)
        self.assertIn("%-8d %.4f" % (weights.neighbors[0].latent, weights.neighbors[0].cosine),
                      shown)
        # A new prompt through the same model and SAE: the first sequence's tokens get the
        # latents stored for its rows (values within fp16's rounding).
        first_rows, first_tokens = c.read_rows(dataset, 0, 32)
        prompt = c.encode_prompt(dataset, first_tokens, latents_per_token=1000, top_latents=1000)
        self.assertFalse(prompt.bos_prepended)
        self.assertEqual([t.token_id for t in prompt.tokens], first_tokens.tolist())
        assert_prompt_matches_rows(self, prompt, first_rows)
        best = max(((v, r, j) for r, t in enumerate(prompt.tokens)
                    for j, v in zip(t.latents, t.values)), key=lambda e: (e[0], -e[1]))
        self.assertEqual((prompt.top_latents[0].latent, prompt.top_latents[0].position),
                         (best[2], best[1]))
        # latentctl: a causal model gives the first 4 tokens the same latents alone.
        shown = daemon.latentctl("prompt", str(dataset), *[str(t) for t in first_tokens[:4]],
                                 "--limit=3").stdout
        self.assertIn("dataset %d: 4 tokens" % dataset, shown)
        best4 = max(((v, r, j) for r, t in enumerate(prompt.tokens[:4])
                     for j, v in zip(t.latents, t.values)), key=lambda e: (e[0], -e[1]))
        top_line = shown.split("top latents over the prompt:\n")[1].splitlines()[1].split()
        self.assertEqual((int(top_line[0]), int(top_line[2])), (best4[2], best4[1]))
        with self.assertRaises(grpc.RpcError) as bad_prompt:
            c.encode_prompt(dataset, [4096])
        self.assertEqual(bad_prompt.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("token_ids[0]", bad_prompt.exception.details())
        with self.assertRaises(grpc.RpcError) as dense_weights:
            c.latent_weights(dense_id, 0)
        self.assertEqual(dense_weights.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
        # A direction projected on the DENSE rows in the daemon (here a latent's decoder row of
        # the trained SAE) ranks the rows as numpy does on the exported activations.
        direction = w_dec[5]
        hidden = numpy.load(c.export(dense_id, "hidden.npz").path)["data"]
        want = hidden.astype(numpy.float64) @ direction.astype(numpy.float64)
        projected = c.project_rows(dense_id, direction, top_n=5, context_before=2,
                                   context_after=1)
        self.assertEqual(projected.rows, hidden.shape[0])
        self.assertAlmostEqual(projected.mean, want.mean(), places=4)
        self.assertEqual([t.row for t in projected.largest], list(numpy.argsort(-want)[:5]))
        self.assertEqual([t.row for t in projected.smallest], list(numpy.argsort(want)[:5]))
        numpy.testing.assert_allclose([t.value for t in projected.largest],
                                      numpy.sort(want)[::-1][:5], rtol=1e-4)
        self.assertEqual(sum(projected.histogram), hidden.shape[0])
        direction_path = os.path.join(self.tmp, "direction.npy")
        numpy.save(direction_path, direction)
        shown = daemon.latentctl("project", str(dense_id), direction_path, "--top=3",
                                 "--cosine", "--plot=" + os.path.join(self.tmp, "proj.png"))
        lines = shown.stdout.splitlines()
        self.assertEqual(lines[0], "dataset %d: cos(x, v) over %d rows, v = %s (64 values)" % (
            dense_id, hidden.shape[0], direction_path))
        cosines = want / (numpy.linalg.norm(hidden, axis=1) * numpy.linalg.norm(direction))
        first = lines[lines.index("largest:") + 1].split()
        self.assertEqual(int(first[1]), int(numpy.argmax(cosines)))
        self.assertTrue(os.path.getsize(os.path.join(self.tmp, "proj.png")) > 0)
        # The same direction named as the latent: its decoder row from the daemon's SAE.
        numpy.testing.assert_allclose(c.latent_weights(dataset, 5, decoder=True).decoder,
                                      direction, rtol=1e-5, atol=1e-6)
        by_latent = daemon.latentctl("project", str(dense_id), "--latent=%d:5" % dataset,
                                     "--top=3").stdout.splitlines()
        self.assertEqual(by_latent[0], "dataset %d: x . v over %d rows, v = latent 5's decoder "
                         "row in dataset %d (64 values)" % (dense_id, hidden.shape[0], dataset))
        first = by_latent[by_latent.index("largest:") + 1].split()
        self.assertEqual(int(first[1]), int(numpy.argmax(want)))


        # The dataset helpers: listing, a server-side export scipy reads back, deletion.
        names = {d.id: d.name for d in c.list_datasets()}
        self.assertEqual(names, {dense_id: "dense", dataset: "sparse"})
        self.assertEqual(c.get_dataset(dataset).nnz, packed.nnz + rows_before(c, dataset, 3))
        exported = c.export(dataset, "loop.npz")
        whole, whole_tokens = c.read_rows(dataset)
        self.assertEqual((scipy.sparse.load_npz(exported.path) != whole).nnz, 0)
        with self.assertRaises(ValueError):
            c.export(dataset, "loop.csv", format="csv")
        # The SAE at a glance: counts from the stored statistics equal the rows' own columns.
        counts = numpy.bincount(whole.indices, minlength=whole.shape[1])
        # Every firing of a latent, latent-major: the column of the rows, in row order.
        for j in (5, int(numpy.argmax(counts))):
            firing_rows, firing_values = c.latent_firings(dataset, j)
            column = whole[:, j].tocoo()
            order = numpy.argsort(column.row)
            self.assertEqual(firing_rows.tolist(), column.row[order].tolist())
            numpy.testing.assert_array_equal(firing_values, column.data[order])
        firing_rows, _, firing_tokens = c.latent_firings(dataset, 5, token_ids=True)
        self.assertEqual(firing_tokens.tolist(), whole_tokens[firing_rows].tolist())
        part_rows, _ = c.latent_firings(dataset, 5, row_start=100, row_count=300)
        self.assertEqual(part_rows.tolist(),
                         [r for r in c.latent_firings(dataset, 5)[0] if 100 <= r < 400])
        shown = daemon.latentctl("firings", str(dataset), "5", "--count=200")
        self.assertEqual(shown.stdout.split(),
                         [w for r, v in zip(*c.latent_firings(dataset, 5, row_count=200))
                          for w in (str(r), "%.6g" % v)])
        self.assertIn("latent 5: %d firings" % len(c.latent_firings(dataset, 5, row_count=200)[0]),
                      shown.stderr)
        glance = c.list_latents(dataset, order="frequent", limit=whole.shape[1])
        self.assertEqual((glance.rows, glance.d_sae), whole.shape)
        self.assertEqual(glance.dead_latents, int((counts == 0).sum()))
        self.assertEqual(glance.dead_latents, c.get_dataset(dataset).dead_latents)
        want = sorted(range(whole.shape[1]), key=lambda l: (-counts[l], l))
        self.assertEqual([l.latent for l in glance.latents], want)
        self.assertEqual([l.firing_count for l in glance.latents], [int(counts[l]) for l in want])
        self.assertEqual(sum(glance.log10_density_histogram), int((counts > 0).sum()))
        table = c.latent_table(dataset)
        self.assertEqual(table["firing_count"].tolist(), counts.tolist())
        self.assertEqual(table["dead_latents"], glance.dead_latents)
        numpy.testing.assert_allclose(table["density"], counts / whole.shape[0])
        paged = c.latent_table(dataset, page_size=7)  # pages that do not divide the width
        self.assertEqual(paged["firing_count"].tolist(), counts.tolist())
        numpy.testing.assert_array_equal(paged["max"], table["max"])
        dead = c.list_latents(dataset, max_firing_count=0, limit=whole.shape[1])
        self.assertEqual([l.latent for l in dead.latents], list(numpy.flatnonzero(counts == 0)))
        shown = daemon.latentctl("latents", str(dataset), "--order=rare", "--limit=2",
                                 "--min_count=1").stdout
        rarest = min(l for l in range(whole.shape[1]) if counts[l] == counts[counts > 0].min())
        self.assertIn("%d dead" % glance.dead_latents, shown)
        lines = shown.splitlines()
        self.assertIn("log10 density of the latents that fired:", lines)
        first_row = lines[[l.split()[0] for l in lines].index("LATENT") + 1]
        self.assertEqual(int(first_row.split()[0]), rarest)
        latent = int(rows.indices[0])
        answer = c.get_latent(sparse.result.extract.dataset_id, latent, top_n=5)
        self.assertGreater(answer.statistics.firing_count, 0)
        self.assertGreater(len(answer.top), 0)
        self.assertTrue(all(len(t.context_token_ids) > 0 for t in answer.top))
        self.assertEqual(len(answer.intervals), 0)  # only on request
        # Top sequences: one row per 32-token sequence, led by the top row.
        per_sequence = c.get_latent(sparse.result.extract.dataset_id, latent, top_n=50,
                                    distinct_sequences=True)
        sequences = [t.row // 32 for t in per_sequence.top]
        self.assertEqual(len(sequences), len(set(sequences)))
        self.assertEqual(per_sequence.top[0].row, answer.top[0].row)
        # Interval samples: every firing counted once, each sample inside its interval.
        sampled = c.get_latent(sparse.result.extract.dataset_id, latent, top_n=5, intervals=4,
                               interval_samples=2)
        self.assertGreaterEqual(len(sampled.intervals), 1)
        self.assertEqual(sum(i.count for i in sampled.intervals),
                         sampled.statistics.firing_count)
        self.assertAlmostEqual(sampled.intervals[-1].high, sampled.statistics.max, places=5)
        for interval in sampled.intervals:
            self.assertEqual(len(interval.samples), min(2, interval.count))
            for sample in interval.samples:
                self.assertTrue(interval.low <= sample.value <= interval.high)
                self.assertGreater(len(sample.context_token_ids), 0)
        # Every example's window carries the latent's value on each of its tokens: the rows'.
        column = whole[:, latent].toarray().ravel().astype(numpy.float32)
        examples = list(answer.top) + list(per_sequence.top)
        examples += [s for interval in sampled.intervals for s in interval.samples]
        for example in examples:
            start = example.context_start_row
            want = column[start:start + len(example.context_token_ids)]
            self.assertEqual(list(example.context_values), want.tolist())
        # What fires with the latent, and on its top token: counts equal the rows' own.
        def expected(selected, leave_out):
            counts = numpy.bincount(whole[selected].indices, minlength=whole.shape[1])
            if leave_out is not None:
                counts[leave_out] = 0
            return sorted(((-int(n), l) for l, n in enumerate(counts) if n > 0))
        fires = numpy.flatnonzero(column > 0)
        cofiring = c.latents_on_rows(dataset, with_latent=latent, limit=whole.shape[1])
        self.assertEqual((cofiring.rows_selected, cofiring.rows_read), (len(fires), len(fires)))
        self.assertEqual([(-l.count, l.latent) for l in cofiring.latents],
                         expected(fires, latent))
        # Ranked as detectors of those rows: precision is the share of each latent's firings
        # that lie on them (every one read, so exact), F1 its harmonic mean with the fraction.
        firings = numpy.bincount(whole.indices, minlength=whole.shape[1])
        on_its_rows = numpy.bincount(whole[fires].indices, minlength=whole.shape[1])
        nearest = c.latents_on_rows(dataset, with_latent=latent, order="f1",
                                    limit=whole.shape[1])
        self.assertEqual(sorted(l.latent for l in nearest.latents),
                         sorted(l.latent for l in cofiring.latents))
        for l in nearest.latents:
            self.assertAlmostEqual(l.precision, on_its_rows[l.latent] / firings[l.latent],
                                   places=12)
            recall = on_its_rows[l.latent] / len(fires)
            self.assertAlmostEqual(l.f1, 2 * l.precision * recall / (l.precision + recall),
                                   places=12)
        f1s = [l.f1 for l in nearest.latents]
        self.assertEqual(f1s, sorted(f1s, reverse=True))
        token = answer.top[0].token_id
        on_token = numpy.flatnonzero(whole_tokens == token)
        seen = c.latents_on_rows(dataset, token_id=token, limit=whole.shape[1])
        self.assertEqual(seen.rows_selected, len(on_token))
        self.assertEqual([(-l.count, l.latent) for l in seen.latents], expected(on_token, None))
        # Rows named by the caller: a mask, indices in any order with repeats, or ranges that
        # overlap; each is the same set of rows (sequences 2 and 5 and rows 7..9).
        picked = numpy.zeros(whole.shape[0], dtype=bool)
        picked[64:96] = picked[160:192] = picked[7:10] = True
        chosen = numpy.flatnonzero(picked)
        for selection in ({"rows": picked}, {"rows": chosen[::-1].tolist() + [8, 70]},
                          {"row_ranges": [(160, 32), (64, 20), (80, 16), (7, 2), (9, 1)]}):
            named = c.latents_on_rows(dataset, limit=whole.shape[1], max_rows=1 << 20,
                                      **selection)
            self.assertEqual((named.rows_selected, named.rows_read), (67, 67))
            self.assertEqual([(-l.count, l.latent) for l in named.latents],
                             expected(chosen, None))
        enriched = c.latents_on_rows(dataset, rows=fires, order="lift", limit=1)
        self.assertEqual(enriched.latents[0].latent, latent)  # fires on all, nowhere else
        # Contrasted with the rows where it is silent: it fires on all of the first and none of
        # the second, so it leads by difference; both sets' counts are the rows' own.
        silent = numpy.flatnonzero(column == 0)
        told = c.latents_on_rows(dataset, rows=fires, versus_rows=silent, order="difference",
                                 limit=whole.shape[1], max_rows=1 << 20)
        self.assertEqual((told.rows_read, told.versus_rows_read), (len(fires), len(silent)))
        self.assertEqual(told.latents[0].latent, latent)
        self.assertEqual((told.latents[0].fraction, told.latents[0].versus_fraction), (1.0, 0.0))
        on_silent = numpy.bincount(whole[silent].indices, minlength=whole.shape[1])
        on_fires = numpy.bincount(whole[fires].indices, minlength=whole.shape[1])
        self.assertEqual({l.latent: (l.count, l.versus_count) for l in told.latents},
                         {l: (int(on_fires[l]), int(on_silent[l]))
                          for l in numpy.flatnonzero(on_fires)})
        differences = [l.fraction - l.versus_fraction for l in told.latents]
        self.assertEqual(differences, sorted(differences, reverse=True))
        # k-sparse probing of the same two sets: chosen on the train spans alone, the latent
        # leads, and alone it tells the held-out rows apart; every row lands on one side.
        probe = c.sparse_probe(dataset, rows=fires, versus_rows=silent, ks=(3, 1), seed=1)
        self.assertEqual(probe["latents"][0], latent)
        self.assertEqual(probe["k"].tolist(), [1, 3])
        self.assertGreaterEqual(probe["test_accuracy"][0], 0.95)
        self.assertGreaterEqual(probe["test_balanced_accuracy"][0], 0.95)  # not the majority's
        # With the rare positives weighed up (204 against 1844), the boundary moves their way.
        weighed = c.sparse_probe(dataset, rows=fires, versus_rows=silent, ks=(3, 1), seed=1,
                                 balanced=True)
        self.assertGreater(weighed["intercepts"][0], probe["intercepts"][0])
        self.assertGreaterEqual(weighed["test_recall"][0], probe["test_recall"][0])
        self.assertGreater(probe["weights"][0][0], 0)  # firing more says positive
        held = probe["examples"]
        self.assertEqual(held["train_positive"] + held["test_positive"], len(fires))
        self.assertEqual(held["train_negative"] + held["test_negative"], len(silent))
        self.assertGreater(min(held.values()), 0)
        self.assertEqual(probe["rows_read"], len(fires) + len(silent))
        # The held-out spans are the test examples, each a run of the rows given.
        held_rows = numpy.concatenate([numpy.arange(s, s + n)
                                       for s, n in probe["test_row_ranges"]])
        self.assertEqual(len(held_rows), held["test_positive"])
        self.assertTrue(numpy.isin(held_rows, fires).all())
        # Its held-out accuracy, recomputed here from the rows and its weights at k = 1.
        held_silent = numpy.concatenate([numpy.arange(s, s + n)
                                         for s, n in probe["test_versus_row_ranges"]])
        values = whole[numpy.concatenate([held_rows, held_silent])][:, probe["latents"][:1]]
        said = values.toarray() @ probe["weights"][0] + probe["intercepts"][0] > 0
        truth = numpy.arange(len(said)) < len(held_rows)
        self.assertAlmostEqual(probe["test_accuracy"][0], numpy.mean(said == truth))
        print("sparse probe: k %s, test accuracy %s, test F1 %s, examples %s" % (
            probe["k"].tolist(), probe["test_accuracy"].round(4).tolist(),
            probe["test_f1"].round(4).tolist(), held), file=sys.stderr)
        # ... drawn for a notebook: a line per metric over k, a row per k with its latents.
        shown = c.show_sparse_probe(dataset, rows=fires, versus_rows=silent, ks=(3, 1),
                                    seed=1)._repr_html_()
        self.assertEqual(shown.count("<polyline"), 4)
        self.assertIn("<tr><td>1</td><td>%.4f</td><td>%.4f</td>" % (
            probe["train_accuracy"][0], probe["test_accuracy"][0]), shown)
        self.assertIn("<td>%d (+" % latent, shown)
        # Documents: the sequences where the latent fires more often than in the median one
        # against those where it fires less, each sequence one example (its values mean-pooled,
        # as SAEBench pools documents): it leads, and it tells held-out documents apart.
        per_sequence = (column[:whole.shape[0] // 32 * 32] > 0).reshape(-1, 32).sum(axis=1)
        often = per_sequence > numpy.median(per_sequence)
        rarely = per_sequence < numpy.median(per_sequence)
        by_document = c.sparse_probe(dataset, sequences=often, versus_sequences=rarely,
                                     ks=(1, 3), pool="mean", seed=2)
        documents = by_document["examples"]
        self.assertEqual(documents["train_positive"] + documents["test_positive"], often.sum())
        self.assertEqual(documents["train_negative"] + documents["test_negative"], rarely.sum())
        self.assertEqual(by_document["latents"][0], latent)
        self.assertGreaterEqual(by_document["test_accuracy"][0], 0.75)
        # Chosen by the difference of pooled means instead (SAEBench's rule), from the same
        # examples: the same split, so the same counts; the latent leads again.
        by_mean = c.sparse_probe(dataset, sequences=often, versus_sequences=rarely, ks=(1, 3),
                                 pool="mean", seed=2, select="mean")
        self.assertEqual(by_mean["examples"], documents)
        self.assertEqual(by_mean["latents"][0], latent)
        print("... selected by mean: latents %s, test accuracy %s" % (
            by_mean["latents"].tolist(), by_mean["test_accuracy"].tolist()), file=sys.stderr)
        with self.assertRaises(ValueError):
            c.sparse_probe(dataset, rows=fires, versus_rows=silent, select="median")
        print("sparse probe by document: latents %s, test accuracy %s, examples %s" % (
            by_document["latents"].tolist(), by_document["test_accuracy"].tolist(), documents),
            file=sys.stderr)
        # Rows may stand for sequences when they are whole ones; a part of one cannot be pooled.
        rare = numpy.flatnonzero(rarely)
        with self.assertRaises(grpc.RpcError) as raised:
            c.sparse_probe(dataset, sequences=often, pool="mean", versus_row_ranges=[
                (int(rare[0]) * 32, 32), (int(rare[-1]) * 32, 5)])
        self.assertEqual(raised.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("versus_row_ranges[1]: rows [%d, %d + 5) are not whole sequences of 32 "
                      "rows" % (rare[-1] * 32, rare[-1] * 32), raised.exception.details())
        # ... and a row named on both sides is refused, naming it.
        with self.assertRaises(grpc.RpcError) as raised:
            c.sparse_probe(dataset, sequences=often, versus_rows=silent)
        self.assertIn("a row is a positive or a negative, not both", raised.exception.details())
        with self.assertRaises(grpc.RpcError) as raised:  # one span cannot be split
            c.sparse_probe(dataset, row_ranges=[(0, 64)], versus_row_ranges=[(64, 64)])
        self.assertEqual(raised.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("row_ranges: 1 unit", raised.exception.details())
        with self.assertRaises(ValueError):
            c.latents_on_rows(dataset, rows=fires, order="difference")
        with self.assertRaises(ValueError):
            c.latents_on_rows(dataset, with_latent=latent, versus_rows=silent)
        with self.assertRaises(grpc.RpcError) as raised:
            c.latents_on_rows(dataset, row_ranges=[(whole.shape[0] - 1, 2)])
        self.assertEqual(raised.exception.code(), grpc.StatusCode.OUT_OF_RANGE)
        self.assertIn("row_ranges[0]", raised.exception.details())
        with self.assertRaises(ValueError):
            c.latents_on_rows(dataset)
        with self.assertRaises(ValueError):
            c.latents_on_rows(dataset, row_ranges=[(3, 0)])
        # The tokens it fires on, over every firing.
        ids, counts = numpy.unique(whole_tokens[fires], return_counts=True)
        on = c.get_latent(dataset, latent, top_n=1, top_tokens=1000).top_tokens
        self.assertEqual([(-t.count, t.token_id) for t in on],
                         sorted(zip((-counts).tolist(), ids.tolist())))
        self.assertAlmostEqual(sum(t.fraction for t in on), 1.0)
        # Where in its 32-token sequences it fires.
        placed = c.get_latent(dataset, latent, top_n=1, positions=True)
        self.assertEqual(placed.position_bin_width, 1)
        self.assertEqual(list(placed.position_histogram),
                         numpy.bincount(fires % 32, minlength=32).tolist())
        # latentctl shows them as text decoded by the inputs' byte-level vocab.json ("\u0120" is a
        # leading space, "\u010a" a newline), and as an HTML page.
        vocab_path = os.path.join(inputs, "vocab.json")
        with open(vocab_path) as f:
            vocab = {token: word for word, token in json.load(f).items()}
        def text(token):
            return vocab[token].replace("\u0120", " ").replace("\u010a", "\u21b5")
        page = os.path.join(self.tmp, "latent.html")
        shown = daemon.latentctl("latent", str(dataset), str(latent), "--top=3",
                                 "--vocab=" + vocab_path, "--html=" + page).stdout
        first = answer.top[0]
        line = "".join(("\u00ab%s\u00bb" if first.context_start_row + i == first.row else "%s")
                       % text(token) for i, token in enumerate(first.context_token_ids))
        self.assertIn(line, shown)
        with open(page, encoding="utf-8") as f:
            html = f.read()
        self.assertTrue(html.startswith("<!DOCTYPE html>"))
        shown_top = answer.top[:3]
        self.assertEqual(len(re.findall(r'<span class="t[^"]*" [^>]*title="row ', html)),
                         sum(len(t.context_token_ids) for t in shown_top))
        self.assertIn("From its weights", html)
        self.assertEqual(html.count('<span class="t at"'), len(shown_top))
        at = html.index('<span class="t at"')
        self.assertIn(">%s</span>" % text(first.token_id).replace("'", "&#39;"),
                      html[at:at + 300])
        # In a notebook: the same examples as HTML, tokens decoded by the caller, shaded.
        view = c.show_latent(dataset, latent, decode=lambda ids: [text(i) for i in ids], top_n=3,
                             intervals=2, interval_samples=1, top_tokens=2)
        shown_html = view._repr_html_()
        examples = list(view.answer.top) + [e for i in view.answer.intervals for e in i.samples]
        self.assertEqual(shown_html.count("<span style=\"background"),
                         sum(len(e.context_token_ids) for e in examples))
        self.assertEqual(shown_html.count("outline"), len(examples))
        self.assertIn("rgba(255,102,0,1.000);outline", shown_html)  # the top row: the max
        self.assertIn("fires most on: <code>%s</code>" % text(on[0].token_id).replace(
            "'", "&#x27;"), shown_html)
        self.assertIn(">%s</span>" % text(first.token_id).replace("'", "&#x27;"), shown_html)
        # Explanations: a delphi run's for the two most frequent latents (the run covers another
        # layer too: the dataset's hook picks its module; its detection scorer scored one), one
        # by hand, and a note from Python; searched by word, carried by GetLatent and latentctl
        # latent.
        delphi_run = os.path.join(self.tmp, "delphi_run")
        hook = c.get_dataset(dataset).hook_name
        os.makedirs(os.path.join(delphi_run, "explanations"))
        os.makedirs(os.path.join(delphi_run, "scores", "detection"))
        first_two = [l.latent for l in glance.latents[:2]]
        for module, texts in ((hook, ("French words", "closing brackets")),
                              ("blocks.0.hook_resid_pre", ("decoy", "decoy"))):
            for j, words in zip(first_two, texts):
                with open(os.path.join(delphi_run, "explanations",
                                       "%s_latent%d.txt" % (module, j)), "w") as f:
                    json.dump(words, f)
        with open(os.path.join(delphi_run, "scores", "detection",
                               "%s_latent%d.txt" % (hook, first_two[1])), "w") as f:
            # Recall 1/2 on the activating examples, 2/2 on the others: balanced accuracy 0.75.
            json.dump([{"str_tokens": ["a"], "activations": [1.0], "distance": 0,
                        "activating": truth, "prediction": guess, "probability": 0.5}
                       for truth, guess in ((True, True), (True, False), (False, False),
                                            (False, False), (True, None))], f)
        stored = daemon.latentctl("explain", str(dataset), delphi_run).stdout.splitlines()
        self.assertEqual(stored, [
            "read 2 explanations of %s from %s; 1 scored by %s (balanced accuracy)" % (
                hook, os.path.join(delphi_run, "explanations"),
                os.path.join(delphi_run, "scores", "detection")),
            "dataset %d: stored 2 explanations; 2 latents explained" % dataset])
        scored = c.get_latent(dataset, first_two[1]).explanation
        self.assertEqual((scored.text, scored.score, scored.source),
                         ("closing brackets", 0.75, "delphi/detection"))
        # Python reads the run as latentctl did.
        self.assertEqual(
            [(r["latent"], r["text"], r.get("score"), r["source"])
             for r in delphi_explanations(delphi_run, module=hook)],
            [(j, e.text, e.score if e.HasField("score") else None, e.source)
             for j, e in ((j, c.get_latent(dataset, j).explanation) for j in sorted(first_two))])
        daemon.latentctl("explain", str(dataset), str(glance.latents[2].latent),
                         "--text=French cities", "--score=0.9")
        c.set_explanations(dataset, [{"latent": glance.latents[3].latent,
                                      "explanation": "nothing French", "score": 0.25}],
                           source="notebook")
        found = daemon.latentctl("search", str(dataset), "french").stdout.splitlines()
        self.assertEqual(found[0], 'dataset %d: 3 of 4 explanations match "french"' % dataset)
        self.assertEqual([int(line.split()[0]) for line in found[2:]],
                         [glance.latents[2].latent, glance.latents[3].latent, first_two[0]])
        self.assertEqual(found[2].split(None, 3)[1:], ["0.9", "human", "French cities"])
        searched = c.search_explanations(dataset, "FRENCH words")
        self.assertEqual([(e.latent, e.text, e.source) for e in searched.explanations],
                         [(first_two[0], "French words", "delphi")])
        self.assertEqual(c.get_latent(dataset, first_two[1]).explanation.text,
                         "closing brackets")
        self.assertIn("explanation: French cities (score 0.9, human)",
                      daemon.latentctl("latent", str(dataset),
                                       str(glance.latents[2].latent)).stdout)
        refused = daemon.latentctl("explain", str(dataset), "999999", "--text=x", check=False)
        self.assertEqual(refused.returncode, 1)
        self.assertIn("INVALID_ARGUMENT: explanations[0].latent: 999999", refused.stderr)
        # A dashboard: index.html links the listed latents' pages, each with its examples, its
        # interval samples and the latents it fires with (and what was written about them).
        board = os.path.join(self.tmp, "board")
        made = daemon.latentctl("dashboard", str(dataset), board, "--order=frequent", "--limit=4",
                                "--intervals=3", "--vocab=" + vocab_path).stdout
        self.assertIn("with 4 latent pages", made)
        with open(os.path.join(board, "index.html"), encoding="utf-8") as f:
            index = f.read()
        linked = re.findall(r'<a href="(latent-\d+\.html)">', index)
        self.assertEqual(linked, ["latent-%d.html" % l.latent for l in glance.latents[:4]])
        self.assertIn("<td>French words (delphi)</td></tr>", index)
        with open(os.path.join(board, linked[2]), encoding="utf-8") as f:
            self.assertIn('<p class="explanation"><b>French cities (score 0.9, human)</b></p>',
                          f.read())
        for name in linked:
            with open(os.path.join(board, name), encoding="utf-8") as f:
                page = f.read()
            for part in ("Top activations", "Interval [", "Fires most on", "Fires with",
                         "Where in its sequences it fires", "From its weights",
                         "direct logit effect through embed.W_E (tied)",
                         "Nearest decoder directions",
                         '<a href="index.html">'):
                self.assertIn(part, page)
            for target in re.findall(r'<a href="([^"]+)">', page):  # no link leads nowhere
                self.assertTrue(os.path.exists(os.path.join(board, target)), target)
        # --replace_all from a JSON Lines file: the dataset's explanations are that file's alone.
        replacing = os.path.join(self.tmp, "replace.jsonl")
        with open(replacing, "w") as f:
            f.write(json.dumps({"latent": first_two[1], "text": "only this one"}) + "\n")
        stored = daemon.latentctl("explain", str(dataset), replacing, "--replace_all").stdout
        self.assertEqual(stored.strip(), "dataset %d: stored 1 explanation; 1 latents "
                         "explained" % dataset)
        self.assertEqual([(e.latent, e.text) for e in c.search_explanations(dataset).explanations],
                         [(first_two[1], "only this one")])
        # The examples of the 5 most frequent latents as JSON Lines for auto-interpretation:
        # top examples as GetLatent gives them, silent windows where the latent fires on no row.
        examples_path = os.path.join(self.tmp, "examples.jsonl")
        made = daemon.latentctl("examples", str(dataset), examples_path, "--order=frequent",
                                "--limit=5", "--top=4", "--silent=6", "--before=3",
                                "--after_tokens=1", "--vocab=" + vocab_path).stdout
        self.assertIn("5 latents", made)
        with open(examples_path, encoding="utf-8") as f:
            lines = [json.loads(line) for line in f]
        self.assertEqual([e["latent"] for e in lines], [l.latent for l in glance.latents[:5]])
        for e in lines:
            column = whole[:, e["latent"]].toarray().ravel()
            self.assertEqual(e["firing_count"], int((column != 0).sum()))
            self.assertEqual(len(e["top"]), 4)
            self.assertEqual(len(e["silent"]), 6)
            for ex in e["top"]:
                self.assertGreater(column[ex["row"]], 0)
            for ex in e["silent"]:
                # The window: 3 rows before, 1 after, within the row's 32-token sequence.
                rows_in = [r for r in range(ex["row"] - 3, ex["row"] + 2)
                           if r // 32 == ex["row"] // 32 and 0 <= r < whole.shape[0]]
                self.assertEqual(len(rows_in), len(ex["token_ids"]))
                self.assertTrue((column[rows_in] == 0).all(), ex)
                self.assertEqual(ex["values"], [0.0] * len(rows_in))
                self.assertEqual(ex["token_ids"], [int(t) for t in whole_tokens[rows_in]])
                # Each token's exact text: the byte-level "\u0120" a space, "\u010a" a newline.
                self.assertEqual(ex["tokens"], [vocab[t].replace("\u0120", " ").replace(
                    "\u010a", "\n") for t in ex["token_ids"]])
        # A prompt's page written into the dashboard: its top latents that have pages there
        # link to them, and every link resolves.
        prompt_page = os.path.join(board, "prompt.html")
        made = daemon.latentctl("prompt", str(dataset), *[str(t) for t in first_tokens[:12]],
                                "--limit=6", "--vocab=" + vocab_path,
                                "--html=" + prompt_page).stdout
        self.assertIn("wrote " + prompt_page, made)
        with open(prompt_page, encoding="utf-8") as f:
            page = f.read()
        shown_top = c.encode_prompt(dataset, first_tokens[:12], top_latents=6).top_latents
        self.assertEqual(len(re.findall(r'<div class="ex">', page)), len(shown_top))
        self.assertEqual(page.count('<span class="t at"'), len(shown_top))
        for target in re.findall(r'<a href="([^"]+)">', page):
            self.assertTrue(os.path.exists(os.path.join(board, target)), target)
        view = c.show_prompt(dataset, first_tokens[:12], decode=lambda ids: [text(i) for i in ids],
                             top_latents=6)
        shown_html = view._repr_html_()
        self.assertEqual(shown_html.count("outline"), len(shown_top))
        self.assertEqual(shown_html.count('<span style="background'), 12 * len(shown_top))
        self.assertIn("latent %d (" % shown_top[0].latent, shown_html)
        # latentctl firings --vocab: each firing row with its token's text.
        shown = daemon.latentctl("firings", str(dataset), "5", "--count=300",
                                 "--vocab=" + vocab_path).stdout.splitlines()
        rows5, values5, tokens5 = c.latent_firings(dataset, 5, row_count=300, token_ids=True)
        self.assertEqual(len(shown), len(rows5))
        for line, r, v, t in zip(shown, rows5, values5, tokens5):
            self.assertEqual(line, '%d %.6g "%s"' % (r, v, text(t)))
        # latentctl token takes the token's text with --vocab.
        if list(vocab.values()).count(vocab[token]) == 1:
            shown = daemon.latentctl("token", str(dataset), text(token).replace("\u21b5", "\n"),
                                     "--vocab=" + vocab_path, "--limit=3").stdout
            self.assertIn("latents on the %d rows of token %d" % (len(on_token), token), shown)
        # latentctl onrows: rows on the command line and in a file (as numpy.savetxt writes
        # them), in any order, overlapping; the answer is Python's for the same rows.
        rows_file = os.path.join(self.tmp, "rows.txt")
        numpy.savetxt(rows_file, numpy.flatnonzero(picked[:100])[::-1], fmt="%d")
        shown = daemon.latentctl("onrows", str(dataset), "160:32", "64:20,80:16",
                                 "--rows_file=" + rows_file, "--rank=lift", "--limit=5",
                                 "--max_rows=100000")
        lines = shown.stdout.splitlines()
        self.assertEqual(lines[0], "dataset %d: latents on the 67 rows named (3 ranges) "
                         "(67 read)" % dataset)
        by_lift = c.latents_on_rows(dataset, rows=picked, order="lift", limit=5,
                                    max_rows=100000)
        self.assertEqual([int(line.split()[0]) for line in lines[2:]],
                         [l.latent for l in by_lift.latents])
        # ... and contrasted: --versus with the rows of sequences 10 and 11.
        contrast_png = os.path.join(self.tmp, "contrast.png")
        contrasted = daemon.latentctl("onrows", str(dataset), "--rows_file=" + rows_file,
                                      "--versus=320:64", "--rank=difference", "--limit=4",
                                      "--max_rows=100000",
                                      "--plot=" + contrast_png).stdout.splitlines()
        self.assertEqual(contrasted[-1], "wrote " + contrast_png)
        with open(contrast_png, "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
        contrasted = contrasted[:-1]
        self.assertEqual(contrasted[1], "versus 64 rows (64 read)")
        told_too = c.latents_on_rows(dataset, rows=numpy.flatnonzero(picked[:100]),
                                     versus_row_ranges=[(320, 64)], order="difference",
                                     limit=4, max_rows=100000)
        self.assertEqual([int(line.split()[0]) for line in contrasted[3:]],
                         [l.latent for l in told_too.latents])
        self.assertEqual(contrasted[3].split()[3], "%.4f" % told_too.latents[0].versus_fraction)
        # cofiring --plot: each latent at (fraction, precision), the first ten numbered.
        detector_png = os.path.join(self.tmp, "detectors.png")
        drawn = daemon.latentctl("cofiring", str(dataset), str(latent), "--rank=f1", "--limit=40",
                                 "--plot=" + detector_png).stdout.splitlines()
        self.assertEqual(drawn[-1], "wrote " + detector_png)
        with open(detector_png, "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
        # --sequences: the items name sequences of 32 rows: sequences 5 and 2 against 10:2 are
        # rows 64:32 and 160:32 against 320:64; Python's sequences= (indices or a mask) alike.
        by_sequence = daemon.latentctl("onrows", str(dataset), "5", "2", "--sequences",
                                       "--versus=10:2", "--rank=difference", "--limit=4",
                                       "--max_rows=100000").stdout.splitlines()
        self.assertEqual(by_sequence[0], "dataset %d: latents on the 64 rows named (2 ranges of "
                         "whole sequences) (64 read)" % dataset)
        self.assertEqual(by_sequence[1], "versus 64 rows (64 read)")
        same_rows = c.latents_on_rows(dataset, row_ranges=[(64, 32), (160, 32)],
                                      versus_row_ranges=[(320, 64)], order="difference",
                                      limit=4, max_rows=100000)
        self.assertEqual([int(line.split()[0]) for line in by_sequence[3:]],
                         [l.latent for l in same_rows.latents])
        for given in ([5, 2, 5], numpy.isin(numpy.arange(whole.shape[0] // 32), [2, 5])):
            self.assertEqual(c.latents_on_rows(dataset, sequences=given, versus_sequences=[11, 10],
                                               order="difference", limit=4, max_rows=100000),
                             same_rows)
        self.assertEqual(daemon.latentctl("cofiring", str(dataset), "3", "--sequences",
                                          check=False).returncode, 2)
        # latentctl probe: the document probe above (sequences from files, mean-pooled), its
        # table the same answer as Python's; the metrics against k drawn.
        often_file = os.path.join(self.tmp, "often.txt")
        rarely_file = os.path.join(self.tmp, "rarely.txt")
        numpy.savetxt(often_file, numpy.flatnonzero(often), fmt="%d")
        numpy.savetxt(rarely_file, numpy.flatnonzero(rarely), fmt="%d")
        probe_png = os.path.join(self.tmp, "probe.png")
        probed = daemon.latentctl("probe", str(dataset), "--rows_file=" + often_file,
                                  "--versus_file=" + rarely_file, "--sequences", "--pool=mean",
                                  "--ks=3,1", "--seed=2", "--plot=" + probe_png).stdout
        lines = probed.splitlines()
        self.assertEqual(lines[1], "sequences: %d + %d to train on, %d + %d held out (positive "
                         "+ negative); latents chosen by firing fraction difference" % (
                             documents["train_positive"], documents["train_negative"],
                             documents["test_positive"], documents["test_negative"]))
        metrics = ("train_accuracy", "test_accuracy", "test_balanced_accuracy",
                   "test_precision", "test_recall", "test_f1")
        self.assertTrue(lines[3].startswith(
            "1     " + "".join("%-9.4f " % by_document[m][0] for m in metrics) +
            "%d (" % by_document["latents"][0]), lines[3])
        self.assertEqual(lines[-1], "wrote " + probe_png)
        with open(probe_png, "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
        for wrong in (["--rows_file=" + often_file, "--sequences"],  # no negatives
                      ["5", "--versus=6", "--pool=mean"],  # pooling rows, not sequences
                      ["5", "--versus=6", "--ks=1,x"]):
            self.assertEqual(daemon.latentctl("probe", str(dataset), *wrong,
                                              check=False).returncode, 2, wrong)
        refused = daemon.latentctl("onrows", str(dataset), "4:0", check=False)
        self.assertEqual(refused.returncode, 2)
        self.assertIn("'4:0': the count must be at least 1", refused.stderr)
        past = daemon.latentctl("onrows", str(dataset), "%d:5" % (whole.shape[0] - 2),
                                check=False)
        self.assertEqual(past.returncode, 1)
        self.assertIn("OUT_OF_RANGE: row_ranges[0]", past.stderr)
        # The same SAE trained with adam instead of smfac: how far the two learned the same
        # directions (CompareSaes) against numpy on both artifacts' decoders.
        adam = c.wait(c.submit("TRAIN", {
            "datasetId": str(dense_id), "sae": {"architecture": "TOPK", "dSae": 128, "k": 8},
            "optimizer": {"name": "adam", "lr": 3e-3}, "batchSize": 64, "steps": 40, "seed": 6,
            "artifactName": "loop-sae-adam"}).id)
        self.assertEqual(adam.state, jobs_pb2.SUCCEEDED, adam.message)
        adam_sparse = c.wait(c.submit("EXTRACT", {
            "model": MODEL, "hookName": "blocks.1.hook_resid_post", "tokens": tokens,
            "sae": {"artifactId": str(adam.result.train.artifact_id)}, "mode": "SPARSE",
            "datasetName": "sparse-adam"}).id)
        self.assertEqual(adam_sparse.state, jobs_pb2.SUCCEEDED, adam_sparse.message)
        adam_dataset = adam_sparse.result.extract.dataset_id
        adam_path = [a.path for a in c.list_artifacts() if a.name == "loop-sae-adam"][0]
        adam_dec = read_safetensors(os.path.join(adam_path, "sae_weights.safetensors"))["W_dec"]
        adam_unit = adam_dec / numpy.maximum(
            numpy.linalg.norm(adam_dec, axis=1, keepdims=True), 1e-30)
        cosines = unit @ adam_unit.T  # the smfac SAE's 256 latents against adam's 128
        compared = c.compare_saes(dataset, adam_dataset, bins=10)
        self.assertEqual(compared["latents"].tolist(), list(range(256)))
        self.assertEqual(compared["best_latents"].tolist(), cosines.argmax(axis=1).tolist())
        numpy.testing.assert_allclose(compared["best_cosines"], cosines.max(axis=1), atol=1e-5)
        self.assertAlmostEqual(compared["mean_best_cosine"], float(cosines.max(axis=1).mean()),
                               places=5)
        self.assertEqual(int(compared["histogram"].sum()), 256)
        shown = daemon.latentctl("compare", str(dataset), str(adam_dataset), "--limit=3").stdout
        self.assertIn("256 latents compared, mean best decoder cosine %.4f"
                      % compared["mean_best_cosine"], shown)
        worst = int(numpy.argmin(cosines.max(axis=1)))
        self.assertIn("%-8d %-8d %.4f" % (worst, int(cosines[worst].argmax()),
                                          cosines[worst].max()), shown)
        c.delete_dataset(adam_dataset)
        c.delete_artifact(adam.result.train.artifact_id)

        # The trained SAE as an artifact: its name is taken until it is deleted, and deleting it
        # removes its files.
        self.assertEqual([(a.id, a.name) for a in listed], [(artifact, "loop-sae")])
        again = {"datasetId": str(dense_id), "sae": {"architecture": "TOPK", "dSae": 256, "k": 8},
                 "optimizer": {"name": "adam", "lr": 1e-3}, "steps": 1, "batchSize": 64,
                 "artifactName": "loop-sae"}
        with self.assertRaises(grpc.RpcError) as taken:
            c.submit("TRAIN", again)
        self.assertEqual(taken.exception.code(), grpc.StatusCode.ALREADY_EXISTS)
        self.assertIn("train.artifact_name", taken.exception.details())
        self.assertTrue(os.path.isdir(listed[0].path))
        out = daemon.latentctl("delete-artifact", str(artifact)).stdout
        self.assertIn("deleted artifact %d" % artifact, out)
        self.assertFalse(os.path.exists(listed[0].path))
        self.assertEqual(c.list_artifacts(), [])
        with self.assertRaises(grpc.RpcError) as gone:
            c.delete_artifact(artifact)
        self.assertEqual(gone.exception.code(), grpc.StatusCode.NOT_FOUND)
        self.assertEqual(c.wait(c.submit("TRAIN", again).id).state, jobs_pb2.SUCCEEDED)
        # The dataset's SAE is gone now: its weights cannot be read, and the error says why.
        with self.assertRaises(grpc.RpcError) as sae_gone:
            c.latent_weights(dataset, 5)
        self.assertEqual(sae_gone.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
        self.assertIn("artifact %d" % artifact, sae_gone.exception.details())
        # Deleting the DENSE dataset leaves the SPARSE one.
        c.delete_dataset(dense_id)
        self.assertEqual([d.id for d in c.list_datasets()], [dataset])
        with self.assertRaises(grpc.RpcError) as missing:
            c.get_dataset(dense_id)
        self.assertEqual(missing.exception.code(), grpc.StatusCode.NOT_FOUND)

    def test_a_matryoshka_sae_reports_its_levels_everywhere(self):
        # Through the daemon: each level's FVU in the telemetry (latentctl's column, the Python
        # client's dict), the result and latentctl get; the artifact extracts like any SAE.
        inputs, daemon = self.inputs_and_daemon()
        c = daemon.client()
        tokens, dense = self.dense_dataset(c, inputs)
        train = c.wait(c.submit("TRAIN", {
            "datasetId": str(dense.result.extract.dataset_id),
            "sae": {"architecture": "BATCHTOPK", "dSae": 128, "k": 8,
                    "matryoshkaWidths": [16, 64]},
            "optimizer": {"name": "adam", "lr": 3e-3}, "batchSize": 64, "steps": 60,
            "telemetryEvery": 20}).id)
        self.assertEqual(train.state, jobs_pb2.SUCCEEDED, train.message)
        result = train.result.train
        self.assertEqual(len(result.final_prefix_fvu), 2)
        # Trained, each level explains more than the one inside it.
        self.assertGreater(result.final_prefix_fvu[0], result.final_prefix_fvu[1])
        self.assertGreater(result.final_prefix_fvu[1], result.final_fvu)
        series = c.train_telemetry(train.id)
        self.assertEqual([s["step"] for s in series], [20, 40, 60])
        self.assertEqual(series[-1]["prefix_fvu"],
                         {16: result.final_prefix_fvu[0], 64: result.final_prefix_fvu[1]})
        got = daemon.latentctl("get", str(train.id)).stdout
        self.assertIn("levels     fvu %.4f from the first 16, %.4f from the first 64 latents" % (
            result.final_prefix_fvu[0], result.final_prefix_fvu[1]), got)
        table = daemon.latentctl("telemetry", str(train.id)).stdout
        self.assertIn("FVU@16/64", table.splitlines()[0])
        self.assertIn("%.4f/%.4f" % tuple(result.final_prefix_fvu), table.splitlines()[-1])
        sparse = c.wait(c.submit("EXTRACT", {
            "model": MODEL, "hookName": "blocks.1.hook_resid_post", "tokens": tokens,
            "sae": {"artifactId": str(result.artifact_id)}}).id)
        self.assertEqual(sparse.state, jobs_pb2.SUCCEEDED, sparse.message)

    def test_a_transcoder_from_two_hooks_to_its_latents(self):
        # The transcoder loop through the daemon: one DENSE job stores the MLP's normed input and
        # its output, TRAIN fits a skip transcoder from one to the other, and a SPARSE job with
        # the artifact stores the input's latents, measuring the prediction against the output.
        inputs, daemon = self.inputs_and_daemon()
        c = daemon.client()
        tokens, dense = self.dense_dataset(c, inputs, hookName="blocks.1.ln2.hook_normalized",
                                           moreOutputs=[{"hookName": "blocks.1.hook_mlp_out"}])
        mlp_in = dense.result.extract.dataset_id
        mlp_out = dense.result.extract.more_outputs[0].dataset_id
        train = c.wait(c.submit("TRAIN", {
            "datasetId": str(mlp_in), "targetDatasetId": str(mlp_out),
            "sae": {"architecture": "TOPK", "dSae": 256, "k": 8, "skipConnection": True},
            "optimizer": {"name": "smfac", "lr": 3e-3, "window": 8, "density": 0.05},
            "batchSize": 64, "steps": 200, "telemetryEvery": 50}).id)
        self.assertEqual(train.state, jobs_pb2.SUCCEEDED, train.message)
        result = train.result.train
        self.assertLess(result.final_fvu, 0.9)
        with open(os.path.join(result.artifact_path, "cfg.json")) as f:
            cfg = json.load(f)
        self.assertEqual(cfg["architecture"], "topk_skip_transcoder")
        self.assertEqual(cfg["hook_name"], "blocks.1.ln2.hook_normalized")
        self.assertEqual(cfg["hook_name_out"], "blocks.1.hook_mlp_out")
        sparse = c.wait(c.submit("EXTRACT", {
            "model": MODEL, "hookName": "blocks.1.ln2.hook_normalized", "tokens": tokens,
            "sae": {"artifactId": str(result.artifact_id)}, "downstreamLossSequences": 8}).id)
        self.assertEqual(sparse.state, jobs_pb2.SUCCEEDED, sparse.message)
        fit = sparse.result.extract.fit
        self.assertEqual(fit.predicted_hook, "blocks.1.hook_mlp_out")
        # The same rows the training ended on: what it explained there, it explains here.
        self.assertAlmostEqual(fit.explained_variance, 1 - result.final_fvu, delta=0.1)
        self.assertGreater(sparse.result.extract.downstream_loss.predictions, 0)
        info = c.get_dataset(sparse.result.extract.dataset_id)
        self.assertEqual(info.hook_name_out, "blocks.1.hook_mlp_out")
        self.assertIn("explained variance of blocks.1.hook_mlp_out",
                      daemon.latentctl("get", str(sparse.id)).stdout)
        self.assertIn("tc topk 8", daemon.latentctl("datasets").stdout)
        # The same transcoder trained on the model's two hooks as training reads them (one
        # forward pass for both, nothing stored) is the stored datasets' one up to rounding.
        live = c.wait(c.submit("TRAIN", {
            "activations": {"model": MODEL, "hookName": "blocks.1.ln2.hook_normalized",
                            "tokens": tokens},
            "targetHookName": "blocks.1.hook_mlp_out",
            "sae": {"architecture": "TOPK", "dSae": 256, "k": 8, "skipConnection": True},
            "optimizer": {"name": "smfac", "lr": 3e-3, "window": 8, "density": 0.05},
            "batchSize": 64, "steps": 200, "telemetryEvery": 50}).id)
        self.assertEqual(live.state, jobs_pb2.SUCCEEDED, live.message)
        stored_weights, live_weights = (
            read_safetensors(os.path.join(p, "sae_weights.safetensors"))
            for p in (result.artifact_path, live.result.train.artifact_path))
        self.assertEqual(sorted(live_weights), ["W_dec", "W_enc", "W_skip", "b_dec", "b_enc"])
        for name in stored_weights:
            numpy.testing.assert_allclose(live_weights[name], stored_weights[name], rtol=1e-3,
                                          atol=1e-4, err_msg=name)
        with open(os.path.join(live.result.train.artifact_path, "cfg.json")) as f:
            self.assertEqual(json.load(f)["hook_name_out"], "blocks.1.hook_mlp_out")
        # A target the forward pass computes before the input is refused at submit.
        with self.assertRaises(grpc.RpcError) as refused:
            c.submit("TRAIN", {
                "activations": {"model": MODEL, "hookName": "blocks.1.ln2.hook_normalized",
                                "tokens": tokens},
                "targetHookName": "blocks.0.hook_mlp_out", "sae": {"dSae": 256},
                "optimizer": {"name": "adam", "lr": 1e-3}})
        self.assertEqual(refused.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("train.target_hook_name", refused.exception.details())

        # Its latents answer as any SAE's: the most frequent one's top row is its largest value.
        rows, _ = c.read_rows(info.id)
        counts = numpy.bincount(rows.indices, minlength=rows.shape[1])
        latent = int(numpy.argmax(counts))
        answer = c.get_latent(info.id, latent, top_n=3)
        self.assertEqual(answer.statistics.firing_count, counts[latent])
        self.assertAlmostEqual(answer.top[0].value, rows[:, latent].max(), places=3)

    def test_a_cross_layer_transcoder_trained_on_a_model_extracts_layer_by_layer(self):
        # TRAIN fits a cross-layer transcoder over both blocks of the model, from each MLP's
        # normed input to every later MLP output, on the model's hooks as training reads them;
        # the artifact is circuit-tracer's release layout, which a SPARSE job then runs layer by
        # layer, measuring each block's prediction. Both are checked against circuit-tracer's
        # formulas applied in numpy to the saved files and the hooks' stored values.
        inputs, daemon = self.inputs_and_daemon()
        c = daemon.client()
        tokens = {"path": os.path.join(inputs, "tokens.npy"), "contextLength": 32}
        source = {"model": MODEL, "hookName": "blocks.0.ln2.hook_normalized", "tokens": tokens}
        clt = {"activations": source, "targetHookName": "blocks.0.hook_mlp_out",
               "sae": {"crossLayers": 2, "dSae": 256, "k": 8},
               # M-FAC's step shrinks as the gradient grows, and the CLT's loss sums the
               # squared errors of every block at unit scale: lr 3 here (docs/TRAIN.md).
               "optimizer": {"name": "smfac", "lr": 3.0, "window": 8, "density": 0.05},
               "batchSize": 64, "steps": 150, "seed": 2, "telemetryEvery": 25,
               "artifactName": "clt"}
        plan = c.plan("TRAIN", clt)
        self.assertIn("BATCHTOPK cross-layer transcoder over blocks 0..1", "\n".join(plan))
        train = c.wait(c.submit("TRAIN", clt).id)
        self.assertEqual(train.state, jobs_pb2.SUCCEEDED, train.message)
        result = train.result.train
        samples = [e.telemetry.train for e in c.watch(train.id)
                   if e.HasField("telemetry") and e.telemetry.HasField("train")]
        self.assertLess(result.final_fvu, 0.7 * samples[0].fvu)
        self.assertLess(result.final_fvu, 0.6)
        self.assertEqual(len(c.list_datasets()), 0)  # nothing stored to train it
        release = result.artifact_path
        with open(os.path.join(release, "config.yaml")) as f:
            config = f.read()
        for line in ("model_kind: cross_layer_transcoder",
                     "feature_input_hook: ln2.hook_normalized",
                     "feature_output_hook: hook_mlp_out", "activation: jumprelu"):
            self.assertIn(line, config)
        enc = [read_safetensors(os.path.join(release, "W_enc_%d.safetensors" % l)) for l in (0, 1)]
        dec = [read_safetensors(os.path.join(release, "W_dec_%d.safetensors" % l))["W_dec_%d" % l]
               for l in (0, 1)]
        self.assertEqual(enc[0]["W_enc_0"].shape, (256, 64))  # nn.Linear's [d_sae, d_in]
        self.assertEqual(dec[0].shape, (256, 2, 64))  # block 0's latents write to blocks 0 and 1
        self.assertEqual(dec[1].shape, (256, 1, 64))

        # The hooks' values, stored once, and the release's latents and fits from a SPARSE job.
        hooks = ["blocks.0.ln2.hook_normalized", "blocks.1.ln2.hook_normalized",
                 "blocks.0.hook_mlp_out", "blocks.1.hook_mlp_out"]
        dense = c.wait(c.submit("EXTRACT", {
            "model": MODEL, "hookName": hooks[0], "tokens": tokens, "mode": "DENSE",
            "valueDtype": "FLOAT32",
            "moreOutputs": [{"hookName": h} for h in hooks[1:]]}).id)
        self.assertEqual(dense.state, jobs_pb2.SUCCEEDED, dense.message)
        ids = [dense.result.extract.dataset_id] + [
            o.dataset_id for o in dense.result.extract.more_outputs]
        x0, x1, y0, y1 = (numpy.load(c.export(i, "hook%d.npz" % i).path)["data"].astype(
            numpy.float64) for i in ids)
        # The same CLT trained on those stored hooks (every block's input, then every block's
        # target) is the live one up to rounding: the same rows in the same order.
        stored = c.wait(c.submit("TRAIN", dict(
            {k: v for k, v in clt.items() if k not in ("activations", "targetHookName")},
            crossLayerDatasetIds=[str(i) for i in ids], artifactName="clt-stored")).id)
        self.assertEqual(stored.state, jobs_pb2.SUCCEEDED, stored.message)
        for name in ("W_enc_0", "W_enc_1", "W_dec_0", "W_dec_1"):
            ours = read_safetensors(os.path.join(stored.result.train.artifact_path,
                                                 name + ".safetensors"))
            theirs = read_safetensors(os.path.join(release, name + ".safetensors"))
            for tensor in theirs:
                # The decoders are small (the targets' scale is folded in): atol relative to them.
                numpy.testing.assert_allclose(
                    ours[tensor], theirs[tensor], rtol=1e-3,
                    atol=1e-3 * float(numpy.abs(theirs[tensor]).max()), err_msg=tensor)
        artifact = {"artifactId": str(result.artifact_id)}
        sparse = c.wait(c.submit("EXTRACT", {
            "model": MODEL, "hookName": hooks[0], "tokens": tokens, "sae": artifact,
            "valueDtype": "FLOAT32",
            "moreOutputs": [{"hookName": hooks[1], "sae": artifact}]}).id)
        self.assertEqual(sparse.state, jobs_pb2.SUCCEEDED, sparse.message)
        outputs = [sparse.result.extract] + list(sparse.result.extract.more_outputs)
        latents = []
        for layer, (x, y, out) in enumerate(zip((x0, x1), (y0, y1), outputs)):
            w = {k: v.astype(numpy.float64) for k, v in enc[layer].items()}
            pre = x @ w["W_enc_%d" % layer].T + w["b_enc_%d" % layer]
            latents.append(numpy.where(pre > w["threshold_%d" % layer], pre, 0.0))
            stored, _ = c.read_rows(out.dataset_id)
            expected = scipy.sparse.csr_matrix(latents[layer])
            # A value within rounding of its threshold may fall either side: a few at most.
            self.assertLess(abs(stored.nnz - expected.nnz), 1 + expected.nnz // 1000)
            numpy.testing.assert_allclose(stored.toarray(), latents[layer], atol=1e-3)
            y_hat = w["b_dec_%d" % layer] + sum(
                latents[l] @ dec[l][:, layer - l, :].astype(numpy.float64)
                for l in range(layer + 1))
            explained = 1 - ((y - y_hat) ** 2).sum() / ((y - y.mean(0)) ** 2).sum()
            self.assertEqual(out.fit.predicted_hook, hooks[2 + layer])
            self.assertAlmostEqual(out.fit.explained_variance, explained, delta=1e-3)
            self.assertGreater(explained, 0.3)
            # What the job said of the block's last batch, over every row (an FVU is free of the
            # scale the CLT trained at).
            self.assertAlmostEqual(result.final_block_fvu[layer], 1 - explained, delta=0.15)
        self.assertIn("blocks     fvu 0: %.4f, 1: %.4f" % tuple(result.final_block_fvu),
                      daemon.latentctl("get", str(train.id)).stdout)
        self.assertIn("%.4f/%.4f" % tuple(samples[-1].block_fvu),
                      daemon.latentctl("telemetry", str(train.id)).stdout)

        # What a CLT cannot be is refused at submit, naming the field.
        for spec, field in (
                (dict(clt, sae={"crossLayers": 3, "dSae": 256}), "train.sae.cross_layers"),
                (dict(clt, sae={"crossLayers": 2, "dSae": 256, "architecture": "TOPK"}),
                 "train.sae.architecture"),
                (dict(clt, activations=dict(source, hookName="blocks.1.ln2.hook_normalized")),
                 "train.activations.hook_name")):
            with self.assertRaises(grpc.RpcError) as refused:
                c.submit("TRAIN", spec)
            self.assertEqual(refused.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
            self.assertIn(field, refused.exception.details())

    def test_a_crosscoder_diffs_two_models_from_their_stored_activations(self):
        # Model diffing as users do it: the same hook of two models (the reference model with two
        # seeds) over one token file, each extracted DENSE; TRAIN fits a crosscoder on the pair.
        # The artifact is dictionary_learning's BatchTopKCrossCoder, whose formulas applied in
        # numpy to the saved file reconstruct both datasets as well as the job said, and the
        # result (and latentctl get) says how the latents split between the two models, as the
        # saved decoders say.
        inputs, daemon = self.inputs_and_daemon()
        c = daemon.client()
        tokens = {"path": os.path.join(inputs, "tokens.npy"), "contextLength": 32}
        ids = []
        for seed in (1, 2):
            dense = c.wait(c.submit("EXTRACT", {
                "model": {"reference": dict(MODEL["reference"], seed=seed)},
                "hookName": "blocks.1.hook_resid_post", "tokens": tokens, "mode": "DENSE",
                "valueDtype": "FLOAT32", "datasetName": "resid-seed-%d" % seed}).id)
            self.assertEqual(dense.state, jobs_pb2.SUCCEEDED, dense.message)
            ids.append(dense.result.extract.dataset_id)
        crosscoder = {"crosscoderDatasetIds": [str(i) for i in ids], "sae": {"dSae": 256, "k": 8},
                      "optimizer": {"name": "adam", "lr": 3e-3}, "batchSize": 64, "steps": 150,
                      "seed": 2, "telemetryEvery": 25, "artifactName": "diff"}
        plan = "\n".join(c.plan("TRAIN", crosscoder))
        self.assertIn("BATCHTOPK crosscoder over 2 sources, d_in 64 each, d_sae 256, k 8", plan)
        train = c.wait(c.submit("TRAIN", crosscoder).id)
        self.assertEqual(train.state, jobs_pb2.SUCCEEDED, train.message)
        result = train.result.train
        summary = result.crosscoder
        self.assertEqual(len(result.final_block_fvu), 2)
        self.assertEqual(len(summary.relative_norm_histogram), 20)
        self.assertEqual(sum(summary.relative_norm_histogram), summary.live_latents)

        saved = result.artifact_path
        with open(os.path.join(saved, "config.json")) as f:
            self.assertEqual(json.load(f), {"activation_dim": 64, "dict_size": 256,
                                            "num_encoder_layers": 2, "k": 8,
                                            "code_normalization": "CROSSCODER"})
        with open(os.path.join(saved, "latentd.json")) as f:
            about = json.load(f)
        self.assertEqual([s["rows_from"] for s in about["sources"]],
                         ["dataset %d" % i for i in ids])
        w = {k: v.astype(numpy.float64) for k, v in
             read_safetensors(os.path.join(saved, "model.safetensors")).items()}
        self.assertEqual(w["encoder.weight"].shape, (2, 64, 256))
        self.assertEqual(w["decoder.weight"].shape, (2, 256, 64))
        self.assertEqual(int(w["k"]), 8)
        # BatchTopKCrossCoder.encode with its threshold, and decode.
        x = numpy.stack([numpy.load(c.export(i, "resid%d.npz" % i).path)["data"].astype(
            numpy.float64) for i in ids], axis=1)  # [rows, 2, 64]
        f = numpy.maximum(numpy.einsum("bld,ldf->bf", x, w["encoder.weight"]) +
                          w["encoder.bias"], 0)
        code_norm = numpy.linalg.norm(w["decoder.weight"], axis=2).sum(0)
        kept = numpy.where(f * code_norm > w["threshold"], f, 0.0)
        x_hat = numpy.einsum("bf,lfd->bld", kept, w["decoder.weight"]) + w["decoder.bias"]
        self.assertGreater((kept != 0).sum(1).mean(), 4)  # about k a row
        self.assertLess((kept != 0).sum(1).mean(), 16)
        for source in (0, 1):
            fvu = (((x[:, source] - x_hat[:, source]) ** 2).sum() /
                   ((x[:, source] - x[:, source].mean(0)) ** 2).sum())
            self.assertLess(fvu, 0.5)
            # The job's figure is of its last batch, this one of every row.
            self.assertAlmostEqual(result.final_block_fvu[source], fvu, delta=0.15)
        # The client's reading of the files computes the same, and the split from the saved
        # decoders at the training scale, of the latents that fire on the rows (calibration read
        # them all), is the result's.
        read = Crosscoder(saved)
        numpy.testing.assert_allclose(read.encode(x), kept, atol=1e-9)
        numpy.testing.assert_allclose(read.decode(kept), x_hat, atol=1e-9)
        live = (kept != 0).any(0)
        relative = read.shares[1, live]
        histogram = numpy.histogram(numpy.minimum(relative, 1 - 1e-12), bins=20, range=(0, 1))[0]
        self.assertEqual(summary.live_latents, live.sum())
        self.assertLessEqual(numpy.abs(histogram - numpy.array(
            summary.relative_norm_histogram)).sum(), 2)  # a share on a bin edge may go either way
        self.assertEqual(summary.exclusive_latents[1], (relative >= 0.9).sum())
        live_ids = numpy.where(live)[0]
        for source in (0, 1):
            own = live_ids[read.shares[source, live] >= 0.9]
            own = own[numpy.argsort(-read.shares[source, own], kind="stable")][:256]
            self.assertEqual(list(summary.own_latents[source].latents), list(own))

        shown = daemon.latentctl("get", str(train.id)).stdout
        self.assertIn("sources    fvu 0: %.4f, 1: %.4f" % tuple(result.final_block_fvu), shown)
        self.assertIn("latents    %d live: %d source 0's own, %d source 1's own, %d shared" % (
            summary.live_latents, summary.exclusive_latents[0], summary.exclusive_latents[1],
            summary.shared_latents), shown)
        self.assertIn("relative   decoder norm  0 |", shown)
        self.assertIn("FVU@S0/S1", daemon.latentctl("telemetry", str(train.id)).stdout)

        # The sources must hold the same tokens' rows; EXTRACT says it does not run crosscoders.
        half = c.wait(c.submit("EXTRACT", {
            "model": MODEL, "hookName": "blocks.1.hook_resid_post",
            "tokens": dict(tokens, sequenceCount="32"), "mode": "DENSE",
            "valueDtype": "FLOAT32"}).id)
        self.assertEqual(half.state, jobs_pb2.SUCCEEDED, half.message)
        for spec, kind, field in (
                (dict(crosscoder, crosscoderDatasetIds=[str(ids[0]),
                                                        str(half.result.extract.dataset_id)]),
                 "TRAIN", "train.crosscoder_dataset_ids[1]"),
                (dict(crosscoder, sae={"dSae": 256, "architecture": "JUMPRELU"}), "TRAIN",
                 "train.sae.architecture"),
                ({"model": MODEL, "hookName": "blocks.1.hook_resid_post", "tokens": tokens,
                  "sae": {"artifactId": str(result.artifact_id)}}, "EXTRACT", "crosscoder")):
            with self.assertRaises(grpc.RpcError) as refused:
                c.submit(kind, spec)
            self.assertEqual(refused.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
            self.assertIn(field, refused.exception.details())

        # The diff's latents on the rows: EXTRACT reads the two stored datasets side by side and
        # encodes them with the crosscoder (no model runs), as the saved file's formulas do; the
        # top rows of a latent of the second model's own come with their tokens' context.
        stored = {"model": {"stored": {"datasetIds": [str(i) for i in ids]}},
                  "sae": {"artifactId": str(result.artifact_id)}, "valueDtype": "FLOAT32",
                  "datasetName": "diff-latents"}
        plan = "\n".join(c.plan("EXTRACT", stored))
        self.assertIn("model: none; stored dataset %d (resid-seed-1): blocks.1.hook_resid_post"
                      % ids[0], plan)
        self.assertIn("dataset diff-latents: dataset %d + dataset %d (128 wide) -> SPARSE "
                      "latents of the crosscoder" % tuple(ids), plan)
        encoded = c.wait(c.submit("EXTRACT", stored).id)
        self.assertEqual(encoded.state, jobs_pb2.SUCCEEDED, encoded.message)
        matrix, token_ids = c.read_rows(encoded.result.extract.dataset_id)
        self.assertEqual(matrix.shape, kept.shape)
        numpy.testing.assert_array_equal(
            token_ids, numpy.load(tokens["path"]).ravel()[:len(token_ids)])
        latents = matrix.toarray().astype(numpy.float64)
        # float32 against float64: a latent right at the threshold may go either way.
        differ = ((latents != 0) != (kept != 0)).sum()
        self.assertLessEqual(differ, kept.size // 1000, "%d of %d" % (differ, kept.size))
        both = (latents != 0) & (kept != 0)
        numpy.testing.assert_allclose(latents[both], kept[both], rtol=1e-4, atol=1e-5)
        own = numpy.where(live & (read.shares[1] >= 0.5))[0]
        j = int(own[numpy.argmax(latents[:, own].max(0))])
        by_source = c.latent_weights(encoded.result.extract.dataset_id, j).decoder_by_source
        numpy.testing.assert_allclose([d.share for d in by_source], read.shares[:, j], rtol=1e-4)
        # Each source's decoder through its own model's unembedding (the two seeds' embeddings
        # differ, so do the tables).
        self.assertEqual([d.logits_source for d in by_source], ["embed.W_E (tied)"] * 2)
        self.assertNotEqual([l.token_id for l in by_source[0].positive_logits],
                            [l.token_id for l in by_source[1].positive_logits])
        shown = daemon.latentctl("weights", str(encoded.result.extract.dataset_id), str(j)).stdout
        self.assertIn("source 1: direct logits through embed.W_E (tied):", shown)
        # A prompt goes through both models (each storing job's) side by side: the first
        # sequence's tokens get the latents its rows have.
        answer = c.encode_prompt(encoded.result.extract.dataset_id, [int(t) for t in
                                                                     token_ids[:32]],
                                 latents_per_token=256)
        prompted = numpy.zeros((32, 256))
        for position, token in enumerate(answer.tokens):
            prompted[position, list(token.latents)] = list(token.values)
        numpy.testing.assert_allclose(prompted, latents[:32], rtol=1e-4, atol=1e-4)
        # Steering runs one model: a crosscoder of two is refused, saying so.
        with self.assertRaises(grpc.RpcError) as two_models:
            c.steer_prompt(encoded.result.extract.dataset_id, [int(t) for t in token_ids[:8]],
                           [(j, "add", 1.0)])
        self.assertEqual(two_models.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
        self.assertIn("crosscoder over several models' activations",
                      two_models.exception.details())
        self.assertIn("crosscoder_source", two_models.exception.details())
        # Named, one model runs, steered along the direction the crosscoder learned for it:
        # each source its own model (the clean runs differ) and its own block of the decoder.
        prompt = [int(t) for t in token_ids[:8]]
        runs = [c.steer_prompt(encoded.result.extract.dataset_id, prompt, [(j, "add", 8.0)],
                               crosscoder_source=s) for s in (0, 1)]
        self.assertNotEqual(list(runs[0].clean.token_losses), list(runs[1].clean.token_losses))
        kl = [run.kl_divergence for run in runs]
        self.assertGreater(kl[1], 0)
        # The other model runs beside the steered one, so the latent's values over the prompt
        # are the crosscoder's over both models (the stored rows'), and SET 0 ablates it from
        # model 1: here on the tokens up to its strongest row, where it fires last.
        peak = int(numpy.argmax(latents[:, j]))
        up_to_peak = [int(t) for t in token_ids[peak - peak % 32:peak + 1]]
        ablated = c.steer_prompt(encoded.result.extract.dataset_id, up_to_peak, [(j, "set", 0.0)],
                                 crosscoder_source=1)
        self.assertEqual(len(ablated.latent_values), 1)
        numpy.testing.assert_allclose(list(ablated.latent_values[0].values),
                                      latents[peak - peak % 32:peak + 1, j], rtol=1e-4, atol=1e-4)
        self.assertGreater(ablated.kl_divergence, 0)
        # Attribution credits the diff's latents in model 1's prediction of the next token, each
        # with its value from both models: the latent at its strongest row among them.
        credited = c.attribute_prompt(encoded.result.extract.dataset_id, up_to_peak, top=1000,
                                      crosscoder_source=1)
        at_peak = [e for e in credited.top_entries
                   if e.latent == j and e.position == len(up_to_peak) - 1]
        self.assertEqual(len(at_peak), 1)
        self.assertAlmostEqual(at_peak[0].activation, latents[peak, j], places=3)
        shown = daemon.latentctl("attribute", str(encoded.result.extract.dataset_id),
                                 *[str(t) for t in up_to_peak], "--crosscoder_source=1").stdout
        self.assertIn("metric log p(", shown)
        self.assertIn("%.4f" % credited.metric, shown)
        self.assertIn("run by the crosscoder's source 1's model", shown)
        # What drives that latent in model 1: an SAE on model 1's block 0 (the demo SAE, over
        # the same tokens) attributed to the diff's latent at its peak, read in model 1 with
        # model 0 beside it: the metric is the latent's stored value there.
        upstream = c.wait(c.submit("EXTRACT", {
            "model": {"reference": dict(MODEL["reference"], seed=2)},
            "hookName": "blocks.0.hook_resid_post", "tokens": tokens,
            "sae": {"path": os.path.join(inputs, "sae")}, "datasetName": "seed-2-block-0"}).id)
        self.assertEqual(upstream.state, jobs_pb2.SUCCEEDED, upstream.message)
        drives = c.attribute_prompt(upstream.result.extract.dataset_id, up_to_peak, top=50,
                                    target_latent=(encoded.result.extract.dataset_id, j,
                                                   len(up_to_peak) - 1))
        self.assertAlmostEqual(drives.metric, latents[peak, j], places=3)
        self.assertGreater(len(drives.top_entries), 0)
        # ... and as an attribution graph's output over that model's SAE, its circuit taken out
        # of one run with model 0 beside it.
        graph = c.attribution_graph([upstream.result.extract.dataset_id], up_to_peak,
                                    target_latent=(encoded.result.extract.dataset_id, j,
                                                   len(up_to_peak) - 1), per_hook=2, ablate=True)
        self.assertAlmostEqual(graph.output.metric, drives.metric, places=5)
        self.assertEqual(len(graph.hooks), 1)
        self.assertTrue(graph.HasField("circuit_ablated_change"), list(graph.notes))
        # The other way round: which of the diff's latents, credited in model 1, drive a latent
        # of model 1's own SAE (the demo SAE run at the crosscoder's hook): the metric is that
        # latent's stored value, each entry's value the crosscoder's over both models (the
        # stored row's). Model 0 does not run that forward: refused naming the target.
        own = c.wait(c.submit("EXTRACT", {
            "model": {"reference": dict(MODEL["reference"], seed=2)},
            "hookName": "blocks.1.hook_resid_post", "tokens": tokens,
            "sae": {"path": os.path.join(inputs, "sae")}, "valueDtype": "FLOAT32",
            "datasetName": "seed-2-block-1"}).id)
        self.assertEqual(own.state, jobs_pb2.SUCCEEDED, own.message)
        own_rows = c.read_rows(own.result.extract.dataset_id)[0].toarray()
        own_latent = int(numpy.argmax(own_rows[peak]))
        self.assertGreater(own_rows[peak, own_latent], 0)
        by_diff = c.attribute_prompt(
            encoded.result.extract.dataset_id, up_to_peak, top=1000, crosscoder_source=1,
            target_latent=(own.result.extract.dataset_id, own_latent, len(up_to_peak) - 1),
            ablate=1)
        self.assertAlmostEqual(by_diff.metric, own_rows[peak, own_latent], places=3)
        self.assertGreater(len(by_diff.top_entries), 0)
        self.assertTrue(by_diff.top_entries[0].HasField("ablated_change"))
        for e in by_diff.top_entries:
            self.assertAlmostEqual(e.activation, latents[peak - peak % 32 + e.position, e.latent],
                                   places=3)
        with self.assertRaises(grpc.RpcError) as other_forward:
            c.attribute_prompt(encoded.result.extract.dataset_id, up_to_peak, crosscoder_source=0,
                               target_latent=(own.result.extract.dataset_id, own_latent,
                                              len(up_to_peak) - 1))
        self.assertEqual(other_forward.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("target_latent.dataset_id", other_forward.exception.details())
        shown = daemon.latentctl(
            "attribute", str(encoded.result.extract.dataset_id), *[str(t) for t in up_to_peak],
            "--crosscoder_source=1",
            "--target_latent=%d:%d@%d" % (own.result.extract.dataset_id, own_latent,
                                          len(up_to_peak) - 1)).stdout
        self.assertIn("%.4f" % by_diff.metric, shown)
        # An attribution graph through the diff, run by model 1: the diff's latents (the output's
        # parents, credited as attribute_prompt credits them) and model 1's block-0 SAE latents
        # driving those, the circuit taken out of one run with model 0 beside it. Unnamed, the
        # model to run is asked for; named with no diff among the datasets, refused.
        suite = [upstream.result.extract.dataset_id, encoded.result.extract.dataset_id]
        diff_graph = c.attribution_graph(suite, up_to_peak, per_hook=2, ablate=True,
                                         crosscoder_source=1)
        self.assertAlmostEqual(diff_graph.output.metric, credited.metric, places=5)
        self.assertEqual([h.dataset_id for h in diff_graph.hooks], suite)
        self.assertGreater(diff_graph.hooks[0].kept_nodes, 0, list(diff_graph.notes))
        self.assertTrue(diff_graph.HasField("circuit_ablated_change"), list(diff_graph.notes))
        with self.assertRaises(grpc.RpcError) as unnamed:
            c.attribution_graph(suite, up_to_peak)
        self.assertEqual(unnamed.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
        self.assertIn("crosscoder_source", unnamed.exception.details())
        with self.assertRaises(grpc.RpcError) as no_diff:
            c.attribution_graph(suite[:1], up_to_peak, crosscoder_source=1)
        self.assertEqual(no_diff.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("crosscoder_source: none of the graph's datasets", no_diff.exception.details())
        shown = daemon.latentctl("graph", str(suite[1]), *[str(t) for t in up_to_peak],
                                 "--layers=%d,%d" % tuple(suite), "--crosscoder_source=1").stdout
        self.assertIn("%.4f" % diff_graph.output.metric, shown)
        self.assertIn("run by the crosscoder's source 1's model", shown)
        # Without --layers the suite is the SAEs of model 1 over the same rows (those of its
        # stored dataset's siblings): block 0's joins the diff, and --all_hooks gives a line
        # for each of them.
        shown = daemon.latentctl("graph", str(suite[1]), *[str(t) for t in up_to_peak],
                                 "--crosscoder_source=1").stdout
        self.assertIn("%.4f" % diff_graph.output.metric, shown)
        self.assertIn("(dataset %d)" % suite[0], shown)
        shown = daemon.latentctl("attribute", str(suite[1]), *[str(t) for t in up_to_peak],
                                 "--crosscoder_source=1", "--all_hooks").stdout
        self.assertIn("the same metric at the other hooks:", shown)
        for dataset in (upstream, own):
            self.assertIn("dataset %d (seed-2-block-" % dataset.result.extract.dataset_id, shown)
        shown = daemon.latentctl("steer", str(encoded.result.extract.dataset_id),
                                 *[str(t) for t in prompt], "--intervene=%d:add=8" % j,
                                 "--crosscoder_source=1", "--new_tokens=2").stdout
        self.assertIn("run by the crosscoder's source 1's model", shown)
        self.assertIn("KL(clean || steered) %.4g nats" % kl[1], shown)
        # Latent scaling of the diff's latents (Minder et al. 2025): per latent, how much of its
        # model-1 direction each model's error and other latents carry, from the stored
        # activations and codes, as numpy computes it from the exported datasets and the rows.
        diff = encoded.result.extract.dataset_id
        decoder = w["decoder.weight"]  # [2, 256, 64], the hooks' own units
        bias = w["decoder.bias"]
        fired = numpy.where((latents != 0).any(0))[0]
        asked = [j, int(next(l for l in fired if l != j))]
        scaled = c.latent_scaling(diff, asked)
        self.assertEqual((scaled["source"], scaled["baseline"]), (1, 0))
        self.assertEqual(list(scaled["latent"]), asked)
        for i, latent in enumerate(asked):
            at = latents[:, latent] != 0
            f = latents[at, latent]
            d = decoder[1, latent]
            self.assertEqual(scaled["rows"][i], at.sum())
            self.assertEqual(scaled["firing_count"][i], at.sum())
            self.assertAlmostEqual(scaled["share"][i], read.shares[1, latent], places=4)
            for m, side in ((1, "source"), (0, "baseline")):
                others = latents[at] @ decoder[m] + bias[m] - f[:, None] * decoder[m, latent]
                scale = (d @ d) * (f @ f)
                self.assertAlmostEqual(scaled["beta_error_" + side][i],
                                       (f @ ((x[at, m] - others) @ d)) / scale, delta=2e-3)
                self.assertAlmostEqual(scaled["beta_reconstruction_" + side][i],
                                       (f @ (others @ d)) / scale, delta=2e-3)
            self.assertAlmostEqual(scaled["error_ratio"][i], scaled["beta_error_baseline"][i] /
                                   scaled["beta_error_source"][i], places=6)
        plot = os.path.join(self.tmp, "scaling.png")
        shown = daemon.latentctl("scaling", str(diff), *[str(l) for l in asked],
                                 "--plot=" + plot).stdout
        self.assertIn("latent scaling of source 1's latents against source 0", shown)
        self.assertIn("wrote " + plot, shown)
        with open(plot, "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
        self.assertIn("%-8d %-6.3f %-8d %-8.3f" % (j, scaled["share"][0], scaled["rows"][0],
                                                   scaled["error_ratio"][0]), shown)
        # In a notebook: a point per latent (its ratios in its hover text), then the table.
        shown = c.show_latent_scaling(diff, asked)._repr_html_()
        for i, latent in enumerate(asked):
            self.assertIn("<title>latent %d: error ratio %.3f, reconstruction ratio %.3f</title>"
                          % (latent, scaled["error_ratio"][i], scaled["reconstruction_ratio"][i]),
                          shown)
            self.assertIn("<tr><td>%d</td><td>%.3f</td>" % (latent, scaled["share"][i]), shown)
        with self.assertRaises(grpc.RpcError) as same:
            c.latent_scaling(diff, [j], source=0, baseline=0)
        self.assertEqual(same.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("baseline: 0 is the source", same.exception.details())
        answer = c.get_latent(encoded.result.extract.dataset_id, j, top_n=3)
        self.assertEqual(answer.statistics.firing_count, (latents[:, j] != 0).sum())
        top = answer.top[0]
        self.assertAlmostEqual(top.value, latents[:, j].max(), places=4)
        self.assertEqual(top.token_id, token_ids[top.row])
        self.assertIn(top.token_id, list(top.context_token_ids))

    def test_a_crosscoder_across_layers_encodes_its_hooks_into_one_dataset(self):
        # TRAIN fits a crosscoder over two layers' residual stream as training reads them; an
        # EXTRACT job encodes with it from both hooks of each forward pass into one dataset,
        # whose rows are the saved file's latents (BatchTopKCrossCoder's formulas in numpy on the
        # hooks' stored values) and whose fit is the reconstruction of both hooks together. The
        # latent queries answer as for any dataset; the weight queries say why they cannot.
        inputs, daemon = self.inputs_and_daemon()
        c = daemon.client()
        tokens = {"path": os.path.join(inputs, "tokens.npy"), "contextLength": 32}
        hooks = ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post"]
        train = c.wait(c.submit("TRAIN", {
            "activations": {"model": MODEL, "hookName": hooks[0], "tokens": tokens},
            "crosscoderHooks": hooks[1:], "sae": {"dSae": 256, "k": 8},
            "optimizer": {"name": "adam", "lr": 3e-3}, "batchSize": 64, "steps": 100, "seed": 3,
            "artifactName": "layers"}).id)
        self.assertEqual(train.state, jobs_pb2.SUCCEEDED, train.message)
        extract = {"model": MODEL, "hookName": hooks[0], "crosscoderHooks": hooks[1:],
                   "tokens": tokens, "valueDtype": "FLOAT32",
                   "sae": {"artifactId": str(train.result.train.artifact_id)}}
        plan = "\n".join(c.plan("EXTRACT", extract))
        self.assertIn("blocks.0.hook_resid_post + blocks.1.hook_resid_post (128 wide) -> SPARSE "
                      "latents of the crosscoder", plan)
        self.assertIn("a crosscoder of 2 hooks, read as a jumprelu SAE over them side by side",
                      plan)
        sparse = c.wait(c.submit("EXTRACT", extract).id)
        self.assertEqual(sparse.state, jobs_pb2.SUCCEEDED, sparse.message)
        dataset = sparse.result.extract.dataset_id
        dense = c.wait(c.submit("EXTRACT", {
            "model": MODEL, "hookName": hooks[0], "tokens": tokens, "mode": "DENSE",
            "valueDtype": "FLOAT32", "moreOutputs": [{"hookName": hooks[1]}]}).id)
        self.assertEqual(dense.state, jobs_pb2.SUCCEEDED, dense.message)
        ids = [dense.result.extract.dataset_id, dense.result.extract.more_outputs[0].dataset_id]
        x = numpy.stack([numpy.load(c.export(i, "layer%d.npz" % i).path)["data"].astype(
            numpy.float64) for i in ids], axis=1)  # [rows, 2, 64]
        read = Crosscoder(train.result.train.artifact_path)
        expected = read.encode(x)
        stored, _ = c.read_rows(dataset)
        nnz = int((expected != 0).sum())
        # A value within rounding of its threshold may fall either side: a few at most.
        self.assertLess(abs(stored.nnz - nnz), 1 + nnz // 1000, plan)
        numpy.testing.assert_allclose(stored.toarray(), expected, atol=1e-3)
        x_hat = read.decode(expected)
        explained = 1 - ((x - x_hat) ** 2).sum() / ((x - x.mean(0)) ** 2).sum()
        self.assertGreater(explained, 0.3)
        self.assertAlmostEqual(sparse.result.extract.fit.explained_variance, explained, delta=1e-3)
        info = c.get_dataset(dataset)
        self.assertEqual(info.d_in, 128)  # both hooks side by side
        latent = int(numpy.argmax((expected != 0).sum(0)))
        answer = c.get_latent(dataset, latent, top_n=5)
        self.assertLessEqual(abs(answer.statistics.firing_count -
                                 int((expected[:, latent] != 0).sum())), 1)
        self.assertEqual(len(answer.top), 5)
        # Its weights: how the latent's decoder splits between the hooks (the saved file's
        # shares, as the Python reader computes them); a prompt, which gives one hook, is refused.
        weights = c.latent_weights(dataset, latent)
        self.assertEqual([d.hook_name for d in weights.decoder_by_source], hooks)
        numpy.testing.assert_allclose([d.share for d in weights.decoder_by_source],
                                      read.shares[:, latent], rtol=1e-4)
        self.assertAlmostEqual(weights.decoder_by_source[0].cosine_with_first, 1, places=5)
        self.assertIn("crosscoder", weights.logits_unavailable)
        self.assertEqual(len(weights.neighbors), 10)
        shown = daemon.latentctl("weights", str(dataset), str(latent)).stdout
        self.assertIn("a crosscoder's latent, its decoder in each source:", shown)
        self.assertIn("source 1 blocks.1.hook_resid_post", shown)
        # A prompt goes through the model to both hooks: the first sequence's tokens as a prompt
        # get the latents its stored rows have.
        first = [int(t) for t in numpy.load(tokens["path"]).ravel()[:32]]
        answer = c.encode_prompt(dataset, first, latents_per_token=256)
        prompted = numpy.zeros((32, 256))
        for position, token in enumerate(answer.tokens):
            for latent, value in zip(token.latents, token.values):
                prompted[position, latent] = value
        numpy.testing.assert_allclose(prompted, expected[:32], atol=1e-3)
        # Steering its latent reads it from both hooks and writes both: ablated at one position,
        # the losses before it stay (the model is causal) and the ones from it on move; its
        # values over the prompt are the ones the prompt encodes to. The same through latentctl.
        position = int(numpy.argmax(prompted[:, latent] > 0))
        self.assertGreater(prompted[position, latent], 0)
        steered = c.steer_prompt(dataset, first[:16], [(latent, "set", 0.0, [position])],
                                 new_tokens=2)
        numpy.testing.assert_allclose(steered.latent_values[0].values, prompted[:16, latent],
                                      atol=1e-3)
        numpy.testing.assert_allclose(steered.steered.token_losses[:position],
                                      steered.clean.token_losses[:position], atol=1e-5)
        moved = numpy.abs(numpy.subtract(steered.steered.token_losses[position:],
                                         steered.clean.token_losses[position:]))
        self.assertGreater(moved.max(), 1e-4)
        self.assertGreater(steered.kl_divergence, 0)
        shown = daemon.latentctl("steer", str(dataset), *map(str, first[:16]),
                                 "--intervene=%d:set=0@%d" % (latent, position),
                                 "--new_tokens=2").stdout
        self.assertIn("KL(clean || steered) %.4g nats" % steered.kl_divergence, shown)
        # Attribution credits its entries through both hooks: their values are the prompt's.
        credited = c.attribute_prompt(dataset, first[:16], top=5)
        self.assertEqual(len(credited.top_entries), 5)
        for e in credited.top_entries:
            self.assertAlmostEqual(e.activation, prompted[e.position, e.latent], delta=1e-3)
        # And its latent as a target, read from both hooks: the value the prompt encodes to.
        driven = c.attribute_prompt(dataset, first[:16], target_latent=(dataset, latent, position),
                                    top=3)
        self.assertAlmostEqual(driven.metric, prompted[position, latent], delta=1e-3)

        # Its hooks must be named, in number, alike in width; one output only.
        for spec, field in (
                (dict(extract, crosscoderHooks=[]), "extract.crosscoder_hooks: the crosscoder "
                                                    "reads 2 hooks"),
                (dict(extract, crosscoderHooks=["blocks.0.mlp.hook_post"]),
                 "extract.crosscoder_hooks[0]"),
                (dict(extract, moreOutputs=[{"hookName": hooks[1]}]), "extract.more_outputs"),
                (dict(extract, mode="DENSE", sae=None), "extract.crosscoder_hooks")):
            spec = {k: v for k, v in spec.items() if v is not None}
            with self.assertRaises(grpc.RpcError) as refused:
                c.submit("EXTRACT", spec)
            self.assertEqual(refused.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
            self.assertIn(field, refused.exception.details())

    def test_training_on_a_models_activations_equals_training_on_their_dataset(self):
        train = {"sae": {"architecture": "TOPK", "dSae": 256, "k": 8},
                 "optimizer": {"name": "adam", "lr": 1e-3}, "batchSize": 64, "epochs": 2,
                 "seed": 5, "checkpointEvery": 10, "telemetryEvery": 8}
        c, source, stored, live, log = self.train_stored_and_live(train)
        for job in (stored, live):
            self.assertEqual(job.result.train.steps, 64)  # 2 epochs of 2048 rows
        self.assertAlmostEqual(live.result.train.final_fvu, stored.result.train.final_fvu,
                               places=4)
        # Each sequence ran through the model once per epoch.
        self.assertIn("the model ran over 128 sequences on this node's 1 rank", log)
        # No dataset was made for it; the artifact says which model and hook it was trained on.
        self.assertEqual(len(c.list_datasets()), 1)
        with open(os.path.join(live.result.train.artifact_path, "cfg.json")) as f:
            cfg = json.load(f)
        self.assertEqual(cfg["hook_name"], "blocks.1.hook_resid_post")
        self.assertEqual(cfg["d_in"], 64)

        # What TRAIN cannot read from a model is refused at submit, naming the field.
        for spec, field in (
                (dict(train, activations=dict(source, hookName="blocks.9.hook_resid_post")),
                 "train.activations.hook_name"),
                (dict(train, activations=dict(source, sae={"path": os.path.join(self.tmp, "inputs")})),
                 "train.activations.sae"),
                (dict(train, activations=dict(source, moreOutputs=[
                    {"hookName": "blocks.0.hook_resid_post"}])),
                 "train.activations.more_outputs"),
                (dict(train, activations=source, datasetId="1"), "train.activations"),
                (dict(train, activations=dict(source, model={"stored": {"datasetIds": ["1"]}})),
                 "train.activations.model.stored: stored activations are datasets"),
                (dict(train, activations=dict(source, tokens={
                    "path": "/nonexistent/tokens.npy", "contextLength": 32})),
                 "train.activations.tokens.path")):
            with self.assertRaises(grpc.RpcError) as refused:
                c.submit("TRAIN", spec)
            self.assertIn(refused.exception.code(), (grpc.StatusCode.INVALID_ARGUMENT,
                                                     grpc.StatusCode.PERMISSION_DENIED))
            self.assertIn(field, refused.exception.details())

    def test_ranks_share_the_models_forward_passes(self):
        """Two devices training on a model's activations run each sequence through the model
        once between them, and train what they train on the stored activations."""
        # BatchTopK: its threshold is calibrated on rows every rank reads at the end.
        train = {"sae": {"architecture": "BATCHTOPK", "dSae": 256, "k": 8},
                 "optimizer": {"name": "adam", "lr": 1e-3}, "batchSize": 63, "steps": 40,
                 "seed": 5, "checkpointEvery": 10, "telemetryEvery": 8}
        _, _, _, _, log = self.train_stored_and_live(train, devices="cpu:2")
        # 40 x 63 rows reach into the second pass over the 2048 rows (one window), and the
        # calibration reads the first pass's window again: 3 x 64 sequences between the two
        # ranks, where ranks each computing every row would run 6 x 64.
        self.assertIn("the model ran over 192 sequences on this node's 2 ranks", log)


if __name__ == "__main__":
    unittest.main()
