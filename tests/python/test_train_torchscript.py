"""TRAIN of a user's TorchScript module: a module scripted by python3-torch whose forward(batch)
returns a scalar loss is trained by latentd's loop (engine/train_tool) and comes back as a
TorchScript file that python3-torch loads, with the loss down and the weights where the data put
them. Also: the same run on 2 Gloo ranks, an EFCP optimizer, bad modules refused clearly, and an SAE
training process killed with SIGKILL right after a checkpoint resumes to the same weights."""
import json
import os
import signal
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


class NextToken(torch.nn.Module):
    """A bigram language model: forward(tokens int64 [batch, L]) -> mean next-token loss."""

    def __init__(self, vocab: int):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, 16)
        self.out = torch.nn.Linear(16, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        logits = self.out(self.embed(tokens[:, :-1]))
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 tokens[:, 1:].reshape(-1))


class TokenFileTest(unittest.TestCase):
    def test_a_language_model_trains_on_a_uint16_token_file(self):
        work = tempfile.mkdtemp()
        vocab, context = 32, 16
        # Each token is followed by (3 * token + 1) mod vocab: learnable by a bigram model.
        generator = torch.Generator().manual_seed(0)
        ids = []
        for _ in range(256):
            token = int(torch.randint(vocab, (1,), generator=generator))
            for _ in range(context):
                ids.append(token)
                token = (3 * token + 1) % vocab
        tokens = torch.tensor(ids, dtype=torch.int64)
        path = os.path.join(work, "train.bin")
        tokens.numpy().astype("uint16").tofile(path)
        torch.manual_seed(2)
        module_path = os.path.join(work, "bigram.pt")
        torch.jit.script(NextToken(vocab)).save(module_path)
        out = os.path.join(work, "trained")
        run = subprocess.run([TOOL, "--tokens=" + path, "--context=%d" % context,
                              "--module=" + module_path, "--out=" + out, "--optimizer=adam",
                              "--lr=0.05", "--steps=150", "--batch=32"],
                             capture_output=True, text=True)
        self.assertEqual(run.returncode, 0, run.stderr)
        sequences = tokens.reshape(-1, context)
        with torch.no_grad():
            before = float(torch.jit.load(module_path)(sequences))
            after = float(torch.jit.load(os.path.join(out, "model.pt"))(sequences))
        self.assertGreater(before, 3.0)  # ~ log(32) untrained
        self.assertLess(after, 0.3)
        # A context longer than the file is refused naming the field.
        run = subprocess.run([TOOL, "--tokens=" + path, "--context=100000",
                              "--module=" + module_path, "--out=" + out],
                             capture_output=True, text=True)
        self.assertEqual(run.returncode, 2)
        self.assertIn("train.tokens", run.stderr)


class KillAndResumeTest(unittest.TestCase):
    def test_sigkill_after_a_checkpoint_then_rerun_gives_the_uninterrupted_weights(self):
        work = tempfile.mkdtemp()
        rows = torch.randn(4096, 16, generator=torch.Generator().manual_seed(5))
        rows_path = os.path.join(work, "rows.f32")
        rows.numpy().astype("float32").tofile(rows_path)

        def command(out, job):
            return [TOOL, "--rows=" + rows_path, "--width=16", "--d_sae=64", "--k=4",
                    "--optimizer=smfac", "--lr=0.01", "--density=0.05", "--window=8",
                    "--steps=1500", "--batch=64", "--seed=3", "--schedule=cosine",
                    "--db=" + os.path.join(work, "db"), "--job=%d" % job,
                    "--checkpoint_every=20", "--out=" + out]

        straight = os.path.join(work, "straight")
        run = subprocess.run(command(straight, 1), capture_output=True, text=True)
        self.assertEqual(run.returncode, 0, run.stderr)

        resumed = os.path.join(work, "resumed")
        process = subprocess.Popen(command(resumed, 2), stderr=subprocess.PIPE, text=True)
        for line in process.stderr:
            if line.strip() == "checkpoint 100":
                process.send_signal(signal.SIGKILL)
                break
        process.wait()
        self.assertEqual(process.returncode, -signal.SIGKILL)
        self.assertFalse(os.path.exists(resumed))
        run = subprocess.run(command(resumed, 2), capture_output=True, text=True)
        self.assertEqual(run.returncode, 0, run.stderr)
        resumed_at = [int(l.split()[1]) for l in run.stderr.splitlines() if l.startswith("resumed")]
        self.assertEqual(len(resumed_at), 1, run.stderr)
        self.assertGreaterEqual(resumed_at[0], 100)
        self.assertLess(resumed_at[0], 1500)
        with open(os.path.join(straight, "sae_weights.safetensors"), "rb") as a, \
                open(os.path.join(resumed, "sae_weights.safetensors"), "rb") as b:
            self.assertEqual(a.read(), b.read())


if __name__ == "__main__":
    unittest.main(verbosity=2)
