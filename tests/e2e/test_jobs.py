"""End to end: the real latentd binary, driven through latentctl and the Python stubs."""

import json
import os
import re
import subprocess
import sys
import unittest

import grpc

from harness import DaemonTestCase
from latentd.v1 import jobs_pb2

SMALL_PROBE = {"matmulSize": 128, "iterations": 3, "bandwidthBytes": 1 << 20}


class JobsEndToEnd(DaemonTestCase):
    def setUp(self):
        super().setUp()
        self.daemon = self.start_daemon(devices="cpu:2")
        self.client = self.daemon.client()

    def test_python_probe_job_runs_to_a_result(self):
        job = self.client.submit("PROBE", SMALL_PROBE, num_devices=2, label="py")
        self.assertEqual(job.state, jobs_pb2.PENDING)
        events = list(self.client.watch(job.id))
        sequences = [e.sequence for e in events]
        self.assertEqual(sequences, list(range(1, len(events) + 1)))
        self.assertEqual(events[-1].state.state, jobs_pb2.SUCCEEDED)
        states = [e.state.state for e in events if e.HasField("state")]
        self.assertEqual(states, [jobs_pb2.PENDING, jobs_pb2.RUNNING, jobs_pb2.SUCCEEDED])
        self.assertTrue(any(e.HasField("progress") for e in events))
        final = self.client.get(job.id)
        self.assertEqual(final.state, jobs_pb2.SUCCEEDED)
        self.assertEqual([d.device for d in final.result.probe.devices], ["cpu:0", "cpu:1"])
        for d in final.result.probe.devices:
            self.assertGreater(d.matmul_gflops, 0)
            self.assertGreater(d.memory_bandwidth_gbps, 0)
        # A watcher can resume after any sequence number and gets exactly the rest.
        tail = list(self.client.watch(job.id, after_sequence=sequences[-2]))
        self.assertEqual([e.sequence for e in tail], [sequences[-1]])

    def test_latentctl_submit_watch_get_list_devices(self):
        spec = os.path.join(self.tmp, "probe.json")
        with open(spec, "w") as f:
            json.dump(SMALL_PROBE, f)
        out = self.daemon.latentctl("submit", "--type=PROBE", "--spec=" + spec, "--label=cli")
        job_id = int(out.stdout.strip())
        watch = self.daemon.latentctl("watch", str(job_id))
        self.assertIn("state SUCCEEDED", watch.stdout)
        got = json.loads(self.daemon.latentctl("--json", "get", str(job_id)).stdout)
        self.assertEqual(got["state"], "SUCCEEDED")
        self.assertEqual(got["spec"]["label"], "cli")
        self.assertEqual(len(got["result"]["probe"]["devices"]), 1)
        human = self.daemon.latentctl("get", str(job_id)).stdout
        self.assertIn("GFLOP/s", human)
        listing = self.daemon.latentctl("list").stdout
        self.assertIn("SUCCEEDED", listing)
        devices = json.loads(self.daemon.latentctl("--json", "devices").stdout)
        self.assertEqual([d["name"] for d in devices["devices"]], ["cpu:0", "cpu:1"])

    def test_a_dry_run_says_what_an_extract_job_would_do_and_creates_none(self):
        inputs = os.path.join(self.tmp, "inputs")
        subprocess.run([sys.executable, os.path.join("scripts", "make_demo_inputs.py"), inputs,
                        "--sequences", "8"], check=True, capture_output=True)
        daemon = self.start_daemon(name="plan", devices="cpu:1",
                                   extra_args=["--data_roots=" + self.tmp])
        client = daemon.client()
        spec = {"model": {"reference": {}}, "hookName": "blocks.2.hook_resid_post",
                "tokens": {"path": os.path.join(inputs, "tokens.npy"), "contextLength": 128},
                "sae": {"path": os.path.join(inputs, "sae")}, "datasetName": "planned"}
        lines = client.plan("EXTRACT", spec)
        self.assertTrue(lines[0].startswith("tokens: npy:"), lines)
        self.assertIn("1024 rows (8 sequences of 128)", lines[0])
        self.assertTrue(any(l.startswith("dataset planned: blocks.2.hook_resid_post (256 wide) "
                                         "-> SPARSE latents of the SAE in ") for l in lines), lines)
        path = os.path.join(self.tmp, "extract.json")
        with open(path, "w") as f:
            json.dump(spec, f)
        printed = daemon.latentctl("submit", "--type=EXTRACT", "--spec=" + path, "--dry_run")
        # The same lines, but for the free disk, which other writers change between the calls.
        free = re.compile(r"; [0-9.]+ [MG]B free")
        self.assertEqual([free.sub("", l) for l in printed.stdout.splitlines()],
                         [free.sub("", l) for l in lines])
        # The errors a submit gives, and no job either way.
        spec["hookName"] = "blocks.9.hook_resid_post"
        with self.assertRaises(grpc.RpcError) as refused:
            client.plan("EXTRACT", spec)
        self.assertEqual(refused.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertEqual(list(client.list()), [])

    def test_same_request_id_never_makes_a_second_job(self):
        a = self.daemon.latentctl("submit", "--type=PROBE", "--request_id=once").stdout.strip()
        b = self.daemon.latentctl("submit", "--type=PROBE", "--request_id=once").stdout.strip()
        self.assertEqual(a, b)
        c = self.client.submit("PROBE", request_id="once")
        self.assertEqual(c.id, int(a))
        self.assertEqual(len(list(self.client.list())), 1)

    def test_cancel_a_pending_job_and_list_filters(self):
        # Hold both devices with a long probe so the next job stays PENDING.
        long = self.client.submit("PROBE", {"matmulSize": 512, "iterations": 10000},
                                  num_devices=2)
        self.wait_for_state(self.client, long.id, [jobs_pb2.RUNNING])
        waiting = self.client.submit("PROBE", SMALL_PROBE)
        self.assertEqual(self.client.get(waiting.id).state, jobs_pb2.PENDING)
        pending = [j.id for j in self.client.list(state="PENDING")]
        self.assertEqual(pending, [waiting.id])
        self.daemon.latentctl("cancel", str(waiting.id))
        self.assertEqual(self.client.get(waiting.id).state, jobs_pb2.CANCELLED)
        cancelled = self.client.cancel(long.id)
        self.assertIn(cancelled.state, (jobs_pb2.CANCELLING, jobs_pb2.CANCELLED))
        final = self.client.wait(long.id)
        self.assertEqual(final.state, jobs_pb2.CANCELLED)
        self.assertEqual(final.reason, jobs_pb2.USER_CANCELLED)
        # Devices are free again: a new job runs.
        again = self.client.wait(self.client.submit("PROBE", SMALL_PROBE, num_devices=2).id)
        self.assertEqual(again.state, jobs_pb2.SUCCEEDED)
        # watch exits 3 for a job that did not succeed.
        self.assertEqual(self.daemon.latentctl("watch", str(long.id), check=False).returncode, 3)

    def test_health_and_reflection_are_served(self):
        self.assertEqual(self.daemon.health(), 1)  # SERVING
        # ServerReflectionRequest{list_services: ""} is field 7, length 0.
        reflect = self.client.channel.stream_stream(
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
            request_serializer=None, response_deserializer=None)
        responses = list(reflect(iter([b"\x3a\x00"]), timeout=10))
        self.assertEqual(len(responses), 1)
        for service in (b"latentd.v1.Jobs", b"latentd.v1.Devices", b"grpc.health.v1.Health"):
            self.assertIn(service, responses[0])


if __name__ == "__main__":
    unittest.main()
