"""TRAIN of a user's TorchScript module: a module scripted by python3-torch whose forward(batch)
returns a scalar loss is trained by latentd's loop (engine/train_tool) and comes back as a
TorchScript file that python3-torch loads, with the loss down and the weights where the data put
them. Also: the same run on 2 Gloo ranks, an EFCP optimizer, and bad modules refused clearly."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

import torch

TOOL = os.environ["TRAIN_TOOL"]
WIDTH = 9  # 8 features + the target in the last column


class Regression(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(WIDTH - 1, 1)

    def forward(self, batch: torch.Tensor) -> torch.Tensor:
        prediction = self.linear(batch[:, :-1])
        return ((prediction - batch[:, -1:]) ** 2).mean()


class VectorLoss(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(WIDTH - 1, 1)

    def forward(self, batch: torch.Tensor) -> torch.Tensor:
        return (self.linear(batch[:, :-1]) - batch[:, -1:]).flatten()


class TrainTorchScriptTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp()
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(2048, WIDTH - 1, generator=generator)
        cls.w_true = torch.randn(WIDTH - 1, 1, generator=generator)
        y = x @ cls.w_true + 0.5 + 0.01 * torch.randn(2048, 1, generator=generator)
        cls.rows = torch.cat([x, y], dim=1).contiguous()
        cls.rows_path = os.path.join(cls.dir, "rows.f32")
        cls.rows.numpy().astype("float32").tofile(cls.rows_path)
        torch.manual_seed(1)
        cls.module_path = os.path.join(cls.dir, "regression.pt")
        torch.jit.script(Regression()).save(cls.module_path)
        cls.vector_path = os.path.join(cls.dir, "vector.pt")
        torch.jit.script(VectorLoss()).save(cls.vector_path)

    def train(self, out, *extra, module=None):
        return subprocess.run(
            [TOOL, "--rows=" + self.rows_path, "--width=%d" % WIDTH,
             "--module=" + (module or self.module_path), "--out=" + out, *extra],
            capture_output=True, text=True)

    def loss_of(self, path):
        module = torch.jit.load(path)
        with torch.no_grad():
            return float(module(self.rows))

    def test_adam_trains_the_module_and_python_loads_the_result(self):
        out = os.path.join(self.dir, "adam")
        run = self.train(out, "--optimizer=adam", "--lr=0.05", "--steps=300", "--batch=64")
        self.assertEqual(run.returncode, 0, run.stderr)
        metrics = json.loads(run.stdout)
        self.assertEqual(metrics["steps"], 300)
        trained = os.path.join(out, "model.pt")
        before, after = self.loss_of(self.module_path), self.loss_of(trained)
        self.assertLess(after, 0.01 * before)
        weights = torch.jit.load(trained).linear.weight.detach().reshape(-1, 1)
        self.assertTrue(torch.allclose(weights, self.w_true, atol=0.05), (weights, self.w_true))
        # The loop's last reported loss is the module's loss on a batch of these rows.
        self.assertLess(metrics["final_loss"], 0.05 * before)

    def test_two_gloo_ranks_train_the_same_module(self):
        one, two = os.path.join(self.dir, "one"), os.path.join(self.dir, "two")
        common = ["--optimizer=sgd", "--lr=0.05", "--steps=100", "--batch=64"]
        self.assertEqual(self.train(one, *common).returncode, 0)
        run = self.train(two, *common, "--devices=2")
        self.assertEqual(run.returncode, 0, run.stderr)
        a = torch.jit.load(os.path.join(one, "model.pt")).linear.weight
        b = torch.jit.load(os.path.join(two, "model.pt")).linear.weight
        self.assertTrue(torch.allclose(a, b, atol=1e-4), (a, b))

    def test_an_efcp_optimizer_trains_the_module(self):
        out = os.path.join(self.dir, "smfac")
        run = self.train(out, "--optimizer=smfac", "--lr=0.3", "--steps=300", "--batch=64",
                         "--density=0.5", "--window=8", "--damp=1.0")
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertGreater(json.loads(run.stdout)["peak_optimizer_state_bytes"], 0)
        self.assertLess(self.loss_of(os.path.join(out, "model.pt")),
                        0.1 * self.loss_of(self.module_path))

    def test_bad_modules_are_refused_with_a_clear_message(self):
        run = self.train(os.path.join(self.dir, "vector"), module=self.vector_path)
        self.assertEqual(run.returncode, 1)
        self.assertIn("scalar loss", run.stderr)
        run = self.train(os.path.join(self.dir, "missing"),
                         module=os.path.join(self.dir, "missing.pt"))
        self.assertEqual(run.returncode, 2)
        self.assertIn("train.torchscript_path", run.stderr)
        not_script = os.path.join(self.dir, "not_script.pt")
        with open(not_script, "wb") as f:
            f.write(b"not a zip archive")
        run = self.train(os.path.join(self.dir, "junk"), module=not_script)
        self.assertEqual(run.returncode, 2)
        self.assertIn("not a TorchScript module", run.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
