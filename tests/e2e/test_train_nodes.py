"""TRAIN across several latentd nodes: two daemons, one rank each, join one Gloo group through a
TCPStore that the rank-0 node hosts, and train the SAE that one daemon with two ranks trains."""

import json
import os
import socket
import struct
import subprocess
import sys
import time
import unittest

import numpy

from harness import DaemonTestCase
from latentd.v1 import jobs_pb2

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts")
MODEL = {"reference": {"dModel": 32, "nLayers": 2, "nHeads": 4, "dMlp": 64, "vocabSize": 4096,
                       "contextLength": 32, "seed": 1}}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    return {name: numpy.frombuffer(data[8 + n + info["data_offsets"][0]:
                                        8 + n + info["data_offsets"][1]], numpy.float32)
            for name, info in header.items() if name != "__metadata__"}


def assert_same_weights(jobs):
    """The SAEs the TRAIN jobs saved hold the same bits; returns the first one's tensors."""
    weights = [read_safetensors(os.path.join(job.result.train.artifact_path,
                                             "sae_weights.safetensors")) for job in jobs]
    for other in weights[1:]:
        for name in weights[0]:
            numpy.testing.assert_array_equal(weights[0][name], other[name], name)
    return weights[0]


class TrainNodes(DaemonTestCase):
    def setUp(self):
        super().setUp()
        self.inputs = os.path.join(self.tmp, "inputs")
        subprocess.run([sys.executable, os.path.join(SCRIPTS, "make_demo_inputs.py"), self.inputs,
                        "--sequences", "32", "--context", "32", "--d_in", "32", "--d_sae", "64",
                        "--k", "4"], check=True, capture_output=True)

    def node(self, name, devices="cpu:1"):
        daemon = self.start_daemon(name, devices=devices,
                                   extra_args=["--data_roots=" + self.tmp])
        return daemon, daemon.client()

    def dense(self, client, hook="blocks.1.hook_resid_post"):
        job = client.wait(client.submit("EXTRACT", {
            "model": MODEL, "hookName": hook,
            "tokens": {"path": os.path.join(self.inputs, "tokens.npy"), "contextLength": 32},
            "mode": "DENSE", "valueDtype": "FLOAT32", "datasetName": hook}).id)
        self.assertEqual(job.state, jobs_pb2.SUCCEEDED, job.message)
        return job.result.extract.dataset_id

    @staticmethod
    def spec(dataset_id, **extra):
        spec = {"datasetId": str(dataset_id),
                "sae": {"architecture": "TOPK", "dSae": 64, "k": 4},
                "optimizer": {"name": "smfac", "lr": 3e-3, "damp": 1e-4, "window": 8,
                              "density": 0.1},
                "batchSize": 32, "steps": 24, "seed": 7, "checkpointEvery": 8,
                "telemetryEvery": 4}
        spec.update(extra)
        return spec

    def test_two_nodes_train_what_one_node_with_two_devices_trains(self):
        a, ca = self.node("a")
        b, cb = self.node("b")
        solo, csolo = self.node("solo", devices="cpu:2")
        # The same rows on each node, under each node's own dataset id (b extracts a dataset
        # first, so its ids differ from a's: nodes agree on content, not on ids).
        self.dense(cb, hook="blocks.0.hook_resid_post")
        data = {"a": self.dense(ca), "b": self.dense(cb), "solo": self.dense(csolo)}
        self.assertNotEqual(data["a"], data["b"])

        reference = csolo.wait(csolo.submit("TRAIN", self.spec(data["solo"]), num_devices=2).id)
        self.assertEqual(reference.state, jobs_pb2.SUCCEEDED, reference.message)

        address = "127.0.0.1:%d" % free_port()
        rendezvous = {"address": address, "worldSize": 2, "timeoutSeconds": 60}
        # Node b's job starts first and waits for the store that rank 0's job will host.
        job_b = cb.submit("TRAIN", self.spec(data["b"], rendezvous=dict(rendezvous, rankOffset=1)))
        self.wait_for_state(cb, job_b.id, [jobs_pb2.RUNNING])
        time.sleep(0.5)
        job_a = ca.submit("TRAIN", self.spec(data["a"], rendezvous=rendezvous))
        done_a, done_b = ca.wait(job_a.id), cb.wait(job_b.id)
        self.assertEqual(done_a.state, jobs_pb2.SUCCEEDED, done_a.message)
        self.assertEqual(done_b.state, jobs_pb2.SUCCEEDED, done_b.message)

        # Every node keeps its own copy of the model: the same bits, and the bits one daemon
        # with two in-process ranks computes.
        weights = assert_same_weights([done_a, done_b, reference])
        self.assertEqual(sorted(weights), ["W_dec", "W_enc", "b_dec", "b_enc"])
        for job in (done_a, done_b):
            self.assertEqual(job.result.train.steps, 24)
            self.assertEqual(job.result.train.final_loss, reference.result.train.final_loss)
            self.assertGreater(job.result.train.artifact_id, 0)
        # Each node shows its job's telemetry and says how it joined.
        table = b.latentctl("telemetry", str(job_b.id)).stdout
        steps = [int(l.split()[0]) for l in table.splitlines() if l.split() and l.split()[0].isdigit()]
        self.assertEqual(steps, [4, 8, 12, 16, 20, 24])
        log = "\n".join(e.log.text for e in cb.watch(job_b.id) if e.HasField("log"))
        self.assertIn("joining 2 ranks as 1..1 through " + address, log)
        self.assertIn("took rank 0's initial state", log)

    def test_nodes_share_the_models_forward_passes(self):
        """On a model's activations the nodes' ranks split each chunk's sequences between them
        and gather the rows: each node runs half the model's work, and they train what one
        daemon with two devices trains."""
        a, ca = self.node("a")
        b, cb = self.node("b")
        solo, csolo = self.node("solo", devices="cpu:2")
        activations = {"model": MODEL, "hookName": "blocks.1.hook_resid_post",
                       "tokens": {"path": os.path.join(self.inputs, "tokens.npy"),
                                  "contextLength": 32}}
        spec = dict(self.spec(0, activations=activations))
        del spec["datasetId"]
        reference = csolo.wait(csolo.submit("TRAIN", spec, num_devices=2).id)
        self.assertEqual(reference.state, jobs_pb2.SUCCEEDED, reference.message)
        rendezvous = {"address": "127.0.0.1:%d" % free_port(), "worldSize": 2,
                      "timeoutSeconds": 60}
        job_b = cb.submit("TRAIN", dict(spec, rendezvous=dict(rendezvous, rankOffset=1)))
        job_a = ca.submit("TRAIN", dict(spec, rendezvous=rendezvous))
        done_a, done_b = ca.wait(job_a.id), cb.wait(job_b.id)
        self.assertEqual(done_a.state, jobs_pb2.SUCCEEDED, done_a.message)
        self.assertEqual(done_b.state, jobs_pb2.SUCCEEDED, done_b.message)
        assert_same_weights([done_a, done_b, reference])
        # 24 steps of 32 rows stay in the one window of 32 sequences: 16 a node, plus the 2
        # that hold the 64 rows each node hashes before the nodes join (to agree on the data).
        logs = {name: "\n".join(e.log.text for e in client.watch(job.id) if e.HasField("log"))
                for name, client, job in (("a", ca, done_a), ("b", cb, done_b),
                                          ("solo", csolo, reference))}
        self.assertIn("the model ran over 32 sequences on this node's 2 ranks", logs["solo"])
        for name in ("a", "b"):
            self.assertIn("the model ran over 18 sequences on this node's 1 rank", logs[name])

    def test_a_node_with_two_devices_and_a_node_with_one_train_as_three_ranks(self):
        a, ca = self.node("a", devices="cpu:2")  # ranks 0 and 1: one hosts the store
        b, cb = self.node("b")                   # rank 2
        solo, csolo = self.node("solo", devices="cpu:3")
        data = {"a": self.dense(ca), "b": self.dense(cb), "solo": self.dense(csolo)}
        spec = lambda node, **extra: self.spec(data[node], batchSize=33, **extra)
        reference = csolo.wait(csolo.submit("TRAIN", spec("solo"), num_devices=3).id)
        self.assertEqual(reference.state, jobs_pb2.SUCCEEDED, reference.message)
        rendezvous = {"address": "127.0.0.1:%d" % free_port(), "worldSize": 3,
                      "timeoutSeconds": 60}
        job_a = ca.submit("TRAIN", spec("a", rendezvous=rendezvous), num_devices=2)
        job_b = cb.submit("TRAIN", spec("b", rendezvous=dict(rendezvous, rankOffset=2)))
        done = [ca.wait(job_a.id), cb.wait(job_b.id)]
        for job in done:
            self.assertEqual(job.state, jobs_pb2.SUCCEEDED, job.message)
        log = "\n".join(e.log.text for e in ca.watch(job_a.id) if e.HasField("log"))
        self.assertIn("joining 3 ranks as 0..1 through", log)
        assert_same_weights(done + [reference])

    def kill_one_node_and_resume(self, victim):
        """kill -9 node `victim` ("a": rank 0, hosting the store; "b": rank 1) mid-run, restart it
        (its job is re-queued and resumes), continue on the survivor with resume_from_job_id;
        both must finish with the uninterrupted run's model."""
        nodes = {name: self.node(name) for name in ("a", "b")}
        solo, csolo = self.node("solo", devices="cpu:2")
        data = {name: self.dense(client) for name, (_, client) in nodes.items()}
        long_run = {"steps": 600, "checkpointEvery": 50, "telemetryEvery": 50}
        reference = csolo.wait(csolo.submit("TRAIN", self.spec(self.dense(csolo), **long_run),
                                            num_devices=2).id)
        self.assertEqual(reference.state, jobs_pb2.SUCCEEDED, reference.message)

        rendezvous = {"address": "127.0.0.1:%d" % free_port(), "worldSize": 2,
                      "timeoutSeconds": 60}
        specs = {"a": self.spec(data["a"], rendezvous=rendezvous, **long_run),
                 "b": self.spec(data["b"], rendezvous=dict(rendezvous, rankOffset=1), **long_run)}
        jobs = {name: nodes[name][1].submit("TRAIN", specs[name]).id for name in ("b", "a")}
        survivor = "b" if victim == "a" else "a"
        daemon, client = nodes[victim]
        deadline = time.time() + 120
        while client.get(jobs[victim]).progress.units_done < 120 and time.time() < deadline:
            time.sleep(0.01)
        daemon.kill9()
        # The survivor's job fails at once (its peer's connection closed), saying how to go
        # on; its checkpoints stay.
        failed = nodes[survivor][1].wait(jobs[survivor])
        self.assertEqual(failed.state, jobs_pb2.FAILED)
        self.assertLess(failed.progress.units_done, 600)
        self.assertIn("resume_from_job_id %d" % jobs[survivor], failed.message)
        # The killed node comes back: its job is re-queued and waits at the rendezvous; the
        # survivor continues with a job that takes its failed one over.
        daemon.start()
        nodes[victim] = (daemon, daemon.client())
        resumed = nodes[survivor][1].submit(
            "TRAIN", dict(specs[survivor], resumeFromJobId=str(jobs[survivor]))).id
        done = {victim: nodes[victim][1].wait(jobs[victim]),
                survivor: nodes[survivor][1].wait(resumed)}
        for job in done.values():
            self.assertEqual(job.state, jobs_pb2.SUCCEEDED, job.message)
            self.assertEqual(job.result.train.steps, 600)
        self.assertGreater(done[victim].attempts, 1)
        assert_same_weights([done["a"], done["b"], reference])

    def test_kill_9_of_the_rank_0_node_then_resume_gives_the_uninterrupted_model(self):
        self.kill_one_node_and_resume("a")

    def test_kill_9_of_the_rank_1_node_then_resume_gives_the_uninterrupted_model(self):
        self.kill_one_node_and_resume("b")

    def test_latentctl_train_nodes_launches_one_run_over_both(self):
        a, ca = self.node("a")
        b, cb = self.node("b")
        self.dense(cb, hook="blocks.0.hook_resid_post")  # b's ids now differ from a's
        data = {"a": self.dense(ca), "b": self.dense(cb)}
        self.assertNotEqual(data["a"], data["b"])
        spec = self.spec(0)
        del spec["datasetId"]
        path = self.write(spec)
        port = free_port()
        run = a.latentctl("train-nodes", "--nodes=%s,%s" % (a.address, b.address),
                          "--spec=" + path, "--dataset=blocks.1.hook_resid_post",
                          "--rendezvous=127.0.0.1:%d" % port, timeout=300)
        out = run.stdout
        self.assertIn("node %s: job 2, ranks 0..0 of 2, dataset %d" % (a.address, data["a"]), out)
        self.assertIn("node %s: job 3, ranks 1..1 of 2, dataset %d" % (b.address, data["b"]), out)
        self.assertIn("rendezvous 127.0.0.1:%d, run train-" % port, out)
        self.assertIn("rank 0: 24/24 steps", out)
        done = [ca.get(2), cb.get(3)]
        for job in done:
            self.assertEqual(job.state, jobs_pb2.SUCCEEDED, job.message)
            self.assertIn("node %s: job %d SUCCEEDED, artifact %d at %s" % (
                (a if job is done[0] else b).address, job.id, job.result.train.artifact_id,
                job.result.train.artifact_path), out)
        assert_same_weights(done)

        # The second node lacks the dataset: the job already submitted to the first is
        # cancelled, so nothing is left waiting at the rendezvous.
        run = a.latentctl("train-nodes", "--nodes=%s,%s" % (b.address, a.address),
                          "--spec=" + path, "--dataset=blocks.0.hook_resid_post", check=False)
        self.assertEqual(run.returncode, 1)
        self.assertIn("NOT_FOUND: node %s has no dataset named \"blocks.0.hook_resid_post\"" %
                      a.address, run.stderr)
        submitted = [j for j in cb.list(job_type="TRAIN") if j.id > 3]
        self.assertEqual(len(submitted), 1)
        self.assertEqual(self.wait_for_state(cb, submitted[0].id,
                                             [jobs_pb2.CANCELLED, jobs_pb2.FAILED]).state,
                         jobs_pb2.CANCELLED)

    def test_latentctl_train_nodes_gives_each_node_its_own_device_count(self):
        a, ca = self.node("a", devices="cpu:2")
        b, cb = self.node("b")
        data = {"a": self.dense(ca), "b": self.dense(cb)}
        spec = self.spec(0, batchSize=33)
        del spec["datasetId"]
        path = self.write(spec)
        nodes = "--nodes=%s,%s" % (a.address, b.address)
        # A count per node, or none: the counts must match the nodes.
        bad = a.latentctl("train-nodes", nodes, "--spec=" + path, "--node_devices=2",
                          check=False)
        self.assertEqual(bad.returncode, 2)
        self.assertIn("--node_devices names 1 counts for 2 nodes", bad.stderr)
        run = a.latentctl("train-nodes", nodes, "--spec=" + path, "--node_devices=2,1",
                          "--dataset=blocks.1.hook_resid_post",
                          "--rendezvous=127.0.0.1:%d" % free_port(), timeout=300)
        self.assertIn("node %s: job 2, ranks 0..1 of 3, dataset %d" % (a.address, data["a"]),
                      run.stdout)
        self.assertIn("node %s: job 2, ranks 2..2 of 3, dataset %d" % (b.address, data["b"]),
                      run.stdout)
        done = [ca.get(2), cb.get(2)]
        for job in done:
            self.assertEqual(job.state, jobs_pb2.SUCCEEDED, job.message)
        for client, ranks in ((ca, "0..1"), (cb, "2..2")):
            log = "\n".join(e.log.text for e in client.watch(2) if e.HasField("log"))
            self.assertIn("joining 3 ranks as %s through" % ranks, log)
        assert_same_weights(done)

    def test_nodes_that_disagree_on_the_data_both_fail_saying_how(self):
        a, ca = self.node("a")
        b, cb = self.node("b")
        rendezvous = {"address": "127.0.0.1:%d" % free_port(), "worldSize": 2,
                      "timeoutSeconds": 60}
        data_a = self.dense(ca)
        data_b = self.dense(cb, hook="blocks.0.hook_resid_post")  # same shape, other rows
        job_b = cb.submit("TRAIN", self.spec(data_b, rendezvous=dict(rendezvous, rankOffset=1)))
        job_a = ca.submit("TRAIN", self.spec(data_a, rendezvous=rendezvous))
        for client, job in ((ca, job_a), (cb, job_b)):
            done = client.wait(job.id)
            self.assertEqual(done.state, jobs_pb2.FAILED)
            self.assertIn("train.rendezvous: rank 1", done.message)
            self.assertIn("disagree on the run", done.message)
            self.assertIn("first rows", done.message)

    def test_a_node_whose_peers_never_come_fails_after_the_timeout(self):
        a, ca = self.node("a")
        data = self.dense(ca)
        job = ca.wait(ca.submit("TRAIN", self.spec(data, rendezvous={
            "address": "127.0.0.1:%d" % free_port(), "worldSize": 2, "rankOffset": 0,
            "timeoutSeconds": 2})).id)
        self.assertEqual(job.state, jobs_pb2.FAILED)
        self.assertIn("train.rendezvous: rank 0", job.message)

    def test_bad_rendezvous_fields_are_refused_at_submit(self):
        a, ca = self.node("a")
        data = self.dense(ca)
        for rendezvous, field in (
                ({"address": "nohost", "worldSize": 2}, "train.rendezvous.address"),
                ({"address": "h:0", "worldSize": 2}, "train.rendezvous.address"),
                ({"address": "h:29500", "worldSize": 0}, "train.rendezvous.world_size"),
                ({"address": "h:29500", "worldSize": 2, "rankOffset": 2},
                 "train.rendezvous.rank_offset"),
                ({"address": "h:29500", "worldSize": 2, "timeoutSeconds": -1},
                 "train.rendezvous.timeout_seconds")):
            result = a.latentctl("submit", "--type=TRAIN",
                                 "--spec=" + self.write(self.spec(data, rendezvous=rendezvous)),
                                 check=False)
            self.assertNotEqual(result.returncode, 0, rendezvous)
            self.assertIn("INVALID_ARGUMENT", result.stderr + result.stdout)
            self.assertIn(field, result.stderr + result.stdout)
        # A batch smaller than the world cannot be split.
        result = a.latentctl("submit", "--type=TRAIN", "--spec=" + self.write(self.spec(
            data, batchSize=3, rendezvous={"address": "h:29500", "worldSize": 4})), check=False)
        self.assertIn("train.batch_size: 3 rows cannot be split over 4 ranks",
                      result.stderr + result.stdout)

    def write(self, spec):
        path = os.path.join(self.tmp, "spec.json")
        with open(path, "w") as f:
            json.dump(spec, f)
        return path


if __name__ == "__main__":
    unittest.main()
