"""The Python client's own analysis, without a daemon: the spans sparse_probe and latents_on_rows
send, and the view that draws a sparse probe's answer (the probe itself runs in the daemon:
storage/sparse_probe_test.cc)."""
import json
import os
import re
import tempfile
import unittest

import numpy as np

from latentd.v1 import datasets_pb2
from latentd_client import (Client, SparseProbeView, _batches_of, _spans_of,
                            delphi_explanations)


class SpansOfTest(unittest.TestCase):
    def test_rows_ranges_and_sequences(self):
        self.assertEqual(_spans_of([9, 3, 4, 5, 3], None, None, 1), [(3, 3), (9, 1)])
        self.assertEqual(_spans_of(None, [(10, 5), (12, 8), (0, 1)], None, 1),
                         [(0, 1), (10, 10)])
        # Sequences 2, 3 and 7 of 16 rows: indices or a mask over the sequences.
        mask = np.zeros(8, dtype=bool)
        mask[[2, 3, 7]] = True
        for sequences in ([7, 2, 3], mask):
            self.assertEqual(_spans_of(None, None, sequences, 16), [(32, 32), (112, 16)])


class SetExplanationsTest(unittest.TestCase):
    """set_explanations' calls, against a stand-in for the Datasets stub."""

    class Recorder:
        def __init__(self):
            self.requests = []

        def SetExplanations(self, request, metadata=None, timeout=None):
            self.requests.append(request)
            return datasets_pb2.SetExplanationsResponse(stored=len(request.explanations),
                                                        explained=7)

    def client(self):
        c = Client.__new__(Client)  # no channel: the stub stands in
        c.datasets, c.metadata, c.timeout = self.Recorder(), [], None
        return c

    def test_forms_and_batches(self):
        c = self.client()
        answer = c.set_explanations(3, [{"latent": 5, "explanation": "French", "score": 0.5},
                                        {"latent": 6, "text": "digits", "source": "me"}],
                                    source="delphi", replace_all=True)
        (request,) = c.datasets.requests
        self.assertEqual(request.dataset_id, 3)
        self.assertTrue(request.replace_all)
        self.assertEqual([(e.latent, e.text, e.source, e.HasField("score"))
                          for e in request.explanations],
                         [(5, "French", "delphi", True), (6, "digits", "me", False)])
        self.assertEqual((answer.stored, answer.explained), (2, 7))
        # 3000 explanations of 4000 bytes (12 MB): two calls under 8 MiB each, replace_all
        # with the first alone, the stored counts summed.
        c = self.client()
        answer = c.set_explanations(3, {j: "x" * 4000 for j in range(3000)}, replace_all=True)
        self.assertEqual([len(r.explanations) for r in c.datasets.requests], [2094, 906])
        self.assertEqual([r.replace_all for r in c.datasets.requests], [True, False])
        self.assertTrue(all(r.ByteSize() < 8.1 * (1 << 20) for r in c.datasets.requests))
        self.assertEqual(answer.stored, 3000)

    def test_batches_of(self):
        messages = [datasets_pb2.LatentExplanation(latent=j + 1, text="x" * n)
                    for j, n in enumerate((10, 10, 50, 10))]
        sizes = [m.ByteSize() for m in messages]
        self.assertEqual([[m.latent for m in b] for b in _batches_of(messages, sizes[0] * 2)],
                         [[1, 2], [3], [4]])
        self.assertEqual(_batches_of([], 10), [[]])


class DelphiExplanationsTest(unittest.TestCase):
    """A delphi run's directory read as set_explanations' records (latentctl reads it the same
    way: client/explanation_files_test.cc)."""

    @staticmethod
    def verdicts(pairs):
        return [{"str_tokens": ["a"], "activations": [1.0], "distance": 0, "activating": truth,
                 "prediction": guess, "probability": 0.5} for truth, guess in pairs]

    def test_module_scores_and_refusals(self):
        with tempfile.TemporaryDirectory() as run:
            os.makedirs(os.path.join(run, "explanations"))
            for scorer in ("detection", "fuzz"):
                os.makedirs(os.path.join(run, "scores", scorer))
            for module in ("blocks.1.hook_resid_post", "blocks.2.hook_resid_post"):
                for j in (3, 5):
                    with open(os.path.join(run, "explanations", "%s_latent%d.txt" % (module, j)),
                              "w") as f:
                        json.dump("%s %d" % (module, j), f)
            with open(os.path.join(run, "notes.md"), "w") as f:
                f.write("not a latent's")
            detection = os.path.join(run, "scores", "detection",
                                     "blocks.2.hook_resid_post_latent3.txt")
            with open(detection, "w") as f:  # recalls 2/3 and 0 (and one unanswered)
                json.dump(self.verdicts([(True, True), (True, True), (True, False),
                                         (False, True), (False, None)]), f)
            with open(os.path.join(run, "scores", "fuzz",
                                   "blocks.2.hook_resid_post_latent3.txt"), "w") as f:
                json.dump(self.verdicts([(True, 1), (False, 0), (True, -1)]), f)

            got = delphi_explanations(run, module="blocks.2.hook_resid_post")
            self.assertEqual(got, [
                {"latent": 3, "text": "blocks.2.hook_resid_post 3", "source": "delphi/detection",
                 "score": (2 / 3 + 0) / 2},
                {"latent": 5, "text": "blocks.2.hook_resid_post 5", "source": "delphi"}])
            fuzz = delphi_explanations(run, module="blocks.2.hook_resid_post", scores="fuzz")
            self.assertEqual((fuzz[0]["score"], fuzz[0]["source"]), (1.0, "delphi/fuzz"))
            unscored = delphi_explanations(os.path.join(run, "explanations"),
                                           module="blocks.1.hook_resid_post")
            self.assertEqual([r["source"] for r in unscored], ["delphi", "delphi"])

            with self.assertRaisesRegex(ValueError, "2 modules .*name one with module="):
                delphi_explanations(run)
            with self.assertRaisesRegex(ValueError, "module: no latent files of layers.6"):
                delphi_explanations(run, module="layers.6")
            with self.assertRaises(FileNotFoundError):
                delphi_explanations(run, module="blocks.2.hook_resid_post", scores="simulation")
            with open(detection, "w") as f:
                json.dump([{"prediction": True}], f)
            with self.assertRaisesRegex(ValueError, 'latent3.txt: record 0 has no boolean '
                                        '"activating"'):
                delphi_explanations(run, module="blocks.2.hook_resid_post")


class SparseProbeViewTest(unittest.TestCase):
    def test_draws_a_line_per_metric_and_a_row_per_k(self):
        answer = {"k": np.array([1, 4]), "train_accuracy": np.array([0.9, 0.95]),
                  "test_accuracy": np.array([0.875, 0.9]), "test_f1": np.array([0.6, 0.7]),
                  "test_precision": np.array([0.5, 0.75]), "test_recall": np.array([0.75, 0.65]),
                  "test_balanced_accuracy": np.array([0.8125, 0.8]),
                  "latents": np.array([17, 3, 40, 8]),
                  "weights": [np.array([1.5]), np.array([1.25, -0.5, 0.25, 2.0])],
                  "intercepts": np.array([-1.0, -2.0]),
                  "examples": {"train_positive": 30, "train_negative": 90, "test_positive": 10,
                               "test_negative": 30}}
        html = SparseProbeView(answer)._repr_html_()
        self.assertEqual(html.count("<polyline"), 4)
        self.assertIn("30 + 90 examples to train on, 10 + 30 held out", html)
        self.assertIn("<tr><td>1</td><td>0.9000</td><td>0.8750</td><td>0.8125</td><td>0.5000</td>"
                      "<td>0.7500</td><td>0.6000</td><td>17 (+1.5)</td></tr>", html)
        self.assertIn("<td>17 (+1.25), 3 (-0.5), 40 (+0.25), 8 (+2)</td>", html)
        # Points below 0.5 are held at the axis' floor, not drawn off the chart.
        answer["test_f1"] = np.array([0.1, 0.2])
        floor = SparseProbeView(answer)._repr_html_()
        ys = [float(y) for y in re.findall(r'cy="([\d.]+)"', floor)]
        self.assertLessEqual(max(ys), 220 - 40)


if __name__ == "__main__":
    unittest.main()
