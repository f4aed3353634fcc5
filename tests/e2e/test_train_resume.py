"""TRAIN through the daemon: kill -9 after a checkpoint, restart, and the job resumes from it; with a
fixed seed the trained weights equal, byte for byte, those of an uninterrupted run. The same holds
for a cancelled job that a new job continues (resume_from_job_id)."""

import os
import subprocess
import sys
import time
import unittest

import grpc

from harness import DaemonTestCase
from latentd.v1 import jobs_pb2

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts")
MODEL = {"reference": {"dModel": 64, "nLayers": 2, "nHeads": 4, "dMlp": 256, "vocabSize": 4096,
                       "contextLength": 32, "seed": 2}}
STEPS = 400
CHECKPOINT_EVERY = 25


def train_spec(dataset_id, name):
    return {
        "datasetId": str(dataset_id),
        "sae": {"architecture": "TOPK", "dSae": 512, "k": 8},
        "optimizer": {"name": "smfac", "lr": 2e-3, "damp": 1e-4, "window": 16, "density": 0.05,
                      "momentum": 0.9},
        "schedule": {"kind": "COSINE", "warmupSteps": 10},
        "batchSize": 128, "steps": STEPS, "seed": 11, "checkpointEvery": CHECKPOINT_EVERY,
        "telemetryEvery": 25, "artifactName": name}


def wait_until_midway(client, job_id):
    """Until the job has passed two checkpoints and has 50 steps or more to go."""
    deadline = time.time() + 300
    while time.time() < deadline:
        j = client.get(job_id)
        if j.state == jobs_pb2.RUNNING and 2 * CHECKPOINT_EVERY < j.progress.units_done < STEPS - 50:
            return
        if j.state == jobs_pb2.SUCCEEDED:
            raise AssertionError("job %d finished before it could be stopped" % job_id)
        time.sleep(0.005)
    raise AssertionError("job %d never got midway" % job_id)


class TrainResume(DaemonTestCase):
    def test_kill9_resumes_from_the_checkpoint_to_identical_weights(self):
        inputs = os.path.join(self.tmp, "inputs")
        subprocess.run([sys.executable, os.path.join(SCRIPTS, "make_demo_inputs.py"), inputs,
                        "--sequences", "64", "--context", "32", "--d_in", "64"],
                       check=True, capture_output=True)
        daemon = self.start_daemon(devices="cpu:1", extra_args=["--data_roots=" + self.tmp])
        c = daemon.client()
        dense = c.wait(c.submit("EXTRACT", {
            "model": MODEL, "hookName": "blocks.1.hook_resid_post",
            "tokens": {"path": os.path.join(inputs, "tokens.npy"), "contextLength": 32},
            "mode": "DENSE", "valueDtype": "FLOAT32", "datasetName": "dense"}).id)
        self.assertEqual(dense.state, jobs_pb2.SUCCEEDED, dense.message)
        dataset = dense.result.extract.dataset_id

        reference = c.wait(c.submit("TRAIN", train_spec(dataset, "uninterrupted")).id)
        self.assertEqual(reference.state, jobs_pb2.SUCCEEDED, reference.message)

        job = c.submit("TRAIN", train_spec(dataset, "killed"))
        wait_until_midway(c, job.id)
        c.close()
        daemon.kill9()

        daemon.start()
        c = daemon.client()
        final = c.wait(job.id)
        self.assertEqual(final.state, jobs_pb2.SUCCEEDED, final.message)
        self.assertEqual(final.attempts, 2)
        events = list(c.watch(job.id))
        runs = [i for i, e in enumerate(events)
                if e.HasField("state") and e.state.state == jobs_pb2.RUNNING]
        resumed = [e.progress.units_done for e in events[runs[1]:] if e.HasField("progress")]
        self.assertGreaterEqual(resumed[0], CHECKPOINT_EVERY, "second attempt restarted at step 0")

        def weights(job_record):
            path = os.path.join(job_record.result.train.artifact_path, "sae_weights.safetensors")
            with open(path, "rb") as f:
                return f.read()

        self.assertEqual(weights(reference), weights(final))
        self.assertEqual(reference.result.train.final_loss, final.result.train.final_loss)

        # Cancelled, then continued by a new job that takes its checkpoint over: the same weights.
        job = c.submit("TRAIN", train_spec(dataset, "cancelled"))
        wait_until_midway(c, job.id)
        c.cancel(job.id)
        cancelled = c.wait(job.id)
        self.assertEqual(cancelled.state, jobs_pb2.CANCELLED, cancelled.message)
        self.assertIn("resume_from_job_id %d" % job.id, cancelled.message)
        spec = train_spec(dataset, "continued")
        spec["resumeFromJobId"] = str(job.id)
        continued = c.wait(c.submit("TRAIN", spec).id)
        self.assertEqual(continued.state, jobs_pb2.SUCCEEDED, continued.message)
        progress = [e.progress.units_done for e in c.watch(continued.id) if e.HasField("progress")]
        self.assertGreaterEqual(progress[0], CHECKPOINT_EVERY, "the continuation began at step 0")
        self.assertEqual(weights(reference), weights(continued))
        # Finished jobs can be forgotten; what they made stays.
        out = daemon.latentctl("delete-job", str(job.id)).stdout
        self.assertIn("deleted job %d" % job.id, out)
        with self.assertRaises(grpc.RpcError) as gone:
            c.get(job.id)
        self.assertEqual(gone.exception.code(), grpc.StatusCode.NOT_FOUND)
        c.delete_job(continued.id)
        self.assertTrue(os.path.isdir(continued.result.train.artifact_path))


if __name__ == "__main__":
    unittest.main()
