"""Starts the real latentd binary for end-to-end tests and drives it.

Paths come from the environment the sh_test wrapper sets: LATENTD, LATENTCTL, and PYTHONPATH
holding the generated stubs and client/python.
"""

import os
import shutil
import signal
import subprocess
import tempfile
import time
import unittest

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from latentd_client import Client

LATENTD = os.environ.get("LATENTD", "bazel-bin/server/latentd")
LATENTCTL = os.environ.get("LATENTCTL", "bazel-bin/client/latentctl")


class Daemon:
    """One latentd process on an ephemeral loopback port, with its own data dir."""

    def __init__(self, data_dir, devices="cpu:2", extra_args=()):
        self.data_dir = data_dir
        self.devices = devices
        self.extra_args = list(extra_args)
        self.process = None
        self.port = None
        self.log_path = os.path.join(data_dir, "latentd.log")

    def start(self, timeout=60):
        os.makedirs(self.data_dir, exist_ok=True)
        port_file = os.path.join(self.data_dir, "port")
        if os.path.exists(port_file):
            os.remove(port_file)
        self.log = open(self.log_path, "a")
        self.process = subprocess.Popen(
            [LATENTD, "--listen=127.0.0.1:0", "--data_dir=" + self.data_dir,
             "--devices=" + self.devices, "--port_file=" + port_file, "--grace_seconds=2"]
            + self.extra_args,
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError("latentd exited with %d:\n%s" % (self.process.returncode,
                                                                   self.read_log()))
            if os.path.exists(port_file):
                with open(port_file) as f:
                    self.port = int(f.read().strip())
                return self
            time.sleep(0.02)
        raise RuntimeError("latentd did not start:\n" + self.read_log())

    @property
    def address(self):
        return "127.0.0.1:%d" % self.port

    def client(self, **kwargs):
        return Client(self.address, **kwargs)

    def kill9(self):
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)
        self.log.close()  # start() opens it again

    def terminate(self, timeout=60):
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=timeout)

    def stop(self):
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)
        if getattr(self, "log", None):
            self.log.close()

    def read_log(self):
        try:
            with open(self.log_path) as f:
                return f.read()[-5000:]
        except OSError:
            return ""

    def health(self, token=None):
        with grpc.insecure_channel(self.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            return stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=10).status

    def latentctl(self, *args, token_file=None, check=True, timeout=120):
        cmd = [LATENTCTL, "--server=" + self.address]
        if token_file:
            cmd.append("--token_file=" + token_file)
        cmd.extend(args)
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError("%s failed (%d):\nstdout: %s\nstderr: %s" % (
                " ".join(cmd), result.returncode, result.stdout, result.stderr))
        return result


def assert_prompt_matches_rows(test, prompt, rows, max_swaps=2):
    """An EncodePrompt answer (asked with every active latent per token) against the stored CSR
    rows of the same tokens: each token's latents are the row's, values within fp16 rounding,
    except at most max_swaps latents in all (a swap at a TopK tie)."""
    differing = 0
    for r, token in enumerate(prompt.tokens):
        stored = dict(zip(rows[r].indices.tolist(), rows[r].data.tolist()))
        encoded = dict(zip(token.latents, token.values))
        test.assertEqual(token.active, len(encoded))
        differing += len(set(stored) ^ set(encoded))
        for j in set(stored) & set(encoded):
            test.assertLessEqual(abs(stored[j] - encoded[j]), 1e-3 * abs(encoded[j]) + 1e-4,
                                 "position %d latent %d" % (r, j))
    test.assertLessEqual(differing, max_swaps)


class DaemonTestCase(unittest.TestCase):
    """A test case with a scratch directory removed afterwards and daemons stopped."""

    def setUp(self):
        base = os.environ.get("TEST_TMPDIR") or tempfile.gettempdir()
        self.tmp = tempfile.mkdtemp(dir=base)
        self.daemons = []

    def tearDown(self):
        for d in self.daemons:
            d.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def start_daemon(self, name="d", **kwargs):
        d = Daemon(os.path.join(self.tmp, name), **kwargs)
        self.daemons.append(d)
        return d.start()

    def wait_for_state(self, client, job_id, states, timeout=120):
        deadline = time.time() + timeout
        while time.time() < deadline:
            job = client.get(job_id)
            if job.state in states:
                return job
            time.sleep(0.02)
        self.fail("job %d never reached %s (now %s)" % (job_id, states, job.state))
