"""Bearer-token authentication and the loopback rule."""

import os
import subprocess
import unittest

import grpc

from harness import LATENTD, DaemonTestCase
from latentd.v1 import jobs_pb2
from latentd_client import Client


class Auth(DaemonTestCase):
    def setUp(self):
        super().setUp()
        self.token_file = os.path.join(self.tmp, "token")
        with open(self.token_file, "w") as f:
            f.write("correct-horse-battery\n")
        self.daemon = self.start_daemon(devices="cpu:1",
                                        extra_args=["--auth_token_file=" + self.token_file])

    def assert_unauthenticated(self, client):
        with self.assertRaises(grpc.RpcError) as ctx:
            client.get(1)
        self.assertEqual(ctx.exception.code(), grpc.StatusCode.UNAUTHENTICATED)
        with self.assertRaises(grpc.RpcError) as ctx:
            list(client.watch(1))
        self.assertEqual(ctx.exception.code(), grpc.StatusCode.UNAUTHENTICATED)
        with self.assertRaises(grpc.RpcError) as ctx:
            client.list_devices()
        self.assertEqual(ctx.exception.code(), grpc.StatusCode.UNAUTHENTICATED)
        with self.assertRaises(grpc.RpcError) as ctx:
            client.list_latents(1)
        self.assertEqual(ctx.exception.code(), grpc.StatusCode.UNAUTHENTICATED)
        with self.assertRaises(grpc.RpcError) as ctx:
            client.latents_on_rows(1, with_latent=0)
        self.assertEqual(ctx.exception.code(), grpc.StatusCode.UNAUTHENTICATED)
        with self.assertRaises(grpc.RpcError) as ctx:
            client.latent_weights(1, 0)
        self.assertEqual(ctx.exception.code(), grpc.StatusCode.UNAUTHENTICATED)
        with self.assertRaises(grpc.RpcError) as ctx:
            client.encode_prompt(1, [1, 2])
        self.assertEqual(ctx.exception.code(), grpc.StatusCode.UNAUTHENTICATED)
        with self.assertRaises(grpc.RpcError) as ctx:
            client.latent_firings(1, 0)
        self.assertEqual(ctx.exception.code(), grpc.StatusCode.UNAUTHENTICATED)

    def test_rpcs_need_the_token(self):
        self.assert_unauthenticated(Client(self.daemon.address))
        self.assert_unauthenticated(Client(self.daemon.address, token="wrong"))
        self.assert_unauthenticated(Client(self.daemon.address, token="correct-horse-batter"))
        good = Client(self.daemon.address, token_file=self.token_file)
        job = good.submit("PROBE", {"matmulSize": 64, "iterations": 2})
        self.assertEqual(good.wait(job.id).state, jobs_pb2.SUCCEEDED)

    def test_health_needs_no_token(self):
        self.assertEqual(self.daemon.health(), 1)  # SERVING

    def test_latentctl_with_and_without_token_file(self):
        denied = self.daemon.latentctl("list", check=False)
        self.assertEqual(denied.returncode, 1)
        self.assertIn("UNAUTHENTICATED", denied.stderr)
        self.assertEqual(denied.stdout, "")  # no empty table under the refusal
        ok = self.daemon.latentctl("list", token_file=self.token_file)
        self.assertIn("ID", ok.stdout)

    def test_non_loopback_listen_needs_a_token_or_insecure(self):
        result = subprocess.run(
            [LATENTD, "--listen=0.0.0.0:0", "--data_dir=" + os.path.join(self.tmp, "other"),
             "--devices=cpu:1"], capture_output=True, text=True, timeout=60)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("--auth_token_file", result.stderr)


if __name__ == "__main__":
    unittest.main()
