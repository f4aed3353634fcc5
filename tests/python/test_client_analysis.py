"""The Python client's own analysis, without a daemon: the spans sparse_probe and latents_on_rows
send, and the view that draws a sparse probe's answer (the probe itself runs in the daemon:
storage/sparse_probe_test.cc)."""
import re
import unittest

import numpy as np

from latentd.v1 import datasets_pb2
from latentd_client import Client, SparseProbeView, _batches_of, _spans_of


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
