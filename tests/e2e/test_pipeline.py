"""Pipelines: the whole loop (extract DENSE -> train an SAE -> extract SPARSE with it) submitted
at once, each job waiting for the one before and taking its dataset or SAE from its result."""

import json
import os
import subprocess
import sys
import unittest

import grpc
import numpy

from harness import DaemonTestCase
from latentd.v1 import datasets_pb2, jobs_pb2
from latentd_client import Output

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts")
MODEL = {"reference": {"dModel": 64, "nLayers": 2, "nHeads": 4, "dMlp": 256, "vocabSize": 4096,
                       "contextLength": 32, "seed": 1}}
SAE = {"architecture": "TOPK", "dSae": 256, "k": 8}
OPTIMIZER = {"name": "smfac", "lr": 3e-3, "damp": 1e-4, "window": 8, "density": 0.05}


class Pipeline(DaemonTestCase):
    def setUp(self):
        super().setUp()
        inputs = os.path.join(self.tmp, "inputs")
        subprocess.run([sys.executable, os.path.join(SCRIPTS, "make_demo_inputs.py"), inputs,
                        "--sequences", "32", "--context", "32", "--d_in", "64", "--d_sae", "256",
                        "--k", "8"], check=True, capture_output=True)
        self.source = {"model": MODEL, "hookName": "blocks.1.hook_resid_post",
                       "tokens": {"path": os.path.join(inputs, "tokens.npy"),
                                  "contextLength": 32}}
        self.daemon = self.start_daemon(devices="cpu:1", extra_args=["--data_roots=" + self.tmp])
        self.c = self.daemon.client()

    def train_then_extract(self, **train):
        """A finished DENSE extraction, a TRAIN job on it (with `train` on top of the defaults)
        and a SPARSE extraction with the SAE it will train: (train job, sparse job)."""
        c = self.c
        dense = c.wait(c.submit("EXTRACT", dict(self.source, mode="DENSE",
                                                valueDtype="FLOAT32")).id)
        producer = c.submit("TRAIN", dict({
            "datasetId": str(dense.result.extract.dataset_id), "sae": SAE,
            "optimizer": OPTIMIZER, "batchSize": 32}, **train))
        waiter = c.submit("EXTRACT", dict(self.source, mode="SPARSE", sae={
            "artifactId": Output(producer, "train.artifact_id")}))
        return producer, waiter

    def log_of(self, job_id):
        return [e.log.text for e in self.c.watch(job_id) if e.HasField("log")]

    def test_the_loop_in_one_submission(self):
        c = self.c
        dense = c.submit("EXTRACT", dict(self.source, mode="DENSE", valueDtype="FLOAT32",
                                         datasetName="dense"))
        # TRAIN through latentctl's --bind; the last EXTRACT through the client's Output.
        train_file = os.path.join(self.tmp, "train.json")
        with open(train_file, "w") as f:
            json.dump({"sae": SAE, "optimizer": OPTIMIZER, "batchSize": 64, "steps": 30,
                       "seed": 3, "artifactName": "piped"}, f)
        printed = self.daemon.latentctl(
            "submit", "--type=TRAIN", "--spec=" + train_file,
            "--bind=train.dataset_id=%d:extract.dataset_id" % dense.id).stdout
        train_id = int(printed.strip())
        sparse = c.submit("EXTRACT", dict(self.source, mode="SPARSE", datasetName="sparse",
                                          sae={"artifactId": Output(train_id,
                                                                    "train.artifact_id")}))
        self.assertEqual(list(sparse.spec.after_job_ids), [train_id])
        # The last job waits for the TRAIN (which may already run: its input, 1024 tokens,
        # can finish within the submissions); the order of all three is checked below.
        self.assertEqual(c.get(sparse.id).state, jobs_pb2.PENDING)
        shown = self.daemon.latentctl("get", str(train_id)).stdout
        self.assertIn("binds      train.dataset_id <- job %d's extract.dataset_id" % dense.id,
                      shown)

        done = c.wait(sparse.id)
        self.assertEqual(done.state, jobs_pb2.SUCCEEDED, done.message)
        dense_done, train_done = c.get(dense.id), c.get(train_id)
        self.assertEqual(train_done.state, jobs_pb2.SUCCEEDED, train_done.message)
        # Each ran after the one before it had finished.
        self.assertLessEqual(dense_done.finished.ToNanoseconds(),
                             train_done.started.ToNanoseconds())
        self.assertLessEqual(train_done.finished.ToNanoseconds(), done.started.ToNanoseconds())
        dense_dataset = dense_done.result.extract.dataset_id
        artifact = train_done.result.train.artifact_id
        self.assertIn("bound train.dataset_id = %d (job %d's extract.dataset_id)"
                      % (dense_dataset, dense.id), self.log_of(train_id))
        self.assertIn("bound extract.sae.artifact_id = %d (job %d's train.artifact_id)"
                      % (artifact, train_id), self.log_of(sparse.id))
        # The SPARSE dataset holds the trained SAE's latents over the same rows.
        info = c.datasets.GetDataset(datasets_pb2.GetDatasetRequest(
            dataset_id=done.result.extract.dataset_id))
        self.assertEqual(info.kind, datasets_pb2.SPARSE_LATENTS)
        self.assertEqual(info.d_sae, 256)
        self.assertEqual(done.result.extract.rows, 32 * 32)
        self.assertEqual(done.result.extract.nnz, 32 * 32 * 8)
        # What reads the job's spec later finds the SAE its binding gave it.
        self.assertEqual(done.spec.extract.sae.artifact_id, artifact)
        self.assertFalse(done.submitted_spec.extract.sae.HasField("artifact_id"))
        weights = c.latent_weights(done.result.extract.dataset_id, 0)
        self.assertGreater(weights.decoder_norm, 0)
        self.assertEqual(len(weights.neighbors), 10)

    def test_an_export_job_writes_what_the_extraction_it_waits_for_made(self):
        c = self.c
        dense = c.submit("EXTRACT", dict(self.source, mode="DENSE", valueDtype="FLOAT32"))
        job = c.export(Output(dense, "extract.dataset_id"), "piped/dense.npz", job=True,
                       label="export-dense")
        self.assertEqual(list(job.spec.after_job_ids), [dense.id])
        self.assertEqual(job.type, jobs_pb2.EXPORT)
        done = c.wait(job.id)
        self.assertEqual(done.state, jobs_pb2.SUCCEEDED, done.message)
        written = done.result.export
        self.assertTrue(written.path.endswith("/piped/dense.npz"), written.path)
        self.assertEqual(written.rows, 32 * 32)
        self.assertEqual(numpy.load(written.path)["data"].shape, (32 * 32, 64))
        # It held no device, and said how far it was in rows.
        self.assertEqual(list(done.devices), [])
        self.assertEqual((done.progress.units_done, done.progress.units_total,
                          done.progress.unit), (32 * 32, 32 * 32, "rows"))
        dataset = c.get(dense.id).result.extract.dataset_id
        self.assertEqual(done.spec.export.dataset_id, dataset)

        # latentctl: the same as a job, and `get` says what it wrote.
        printed = self.daemon.latentctl("export", str(dataset), "again.h5", "--format=hdf5",
                                        "--job").stdout
        again = c.wait(int(printed.strip()))
        self.assertEqual(again.state, jobs_pb2.SUCCEEDED, again.message)
        self.assertIn("wrote      %s (1024 rows" % again.result.export.path,
                      self.daemon.latentctl("get", str(again.id)).stdout)
        # A dry run says what it would read and write, and makes no job.
        jobs_before = len(list(c.list()))
        plan = self.daemon.latentctl("export", str(dataset), "plan.npz", "--count=64", "--job",
                                     "--dry_run").stdout
        self.assertIn("reads dataset %d " % dataset, plan)
        self.assertIn("rows [0, 64) of 1024 committed", plan)
        self.assertIn("writes NPZ to ", plan)
        self.assertEqual(len(list(c.list())), jobs_before)
        # In a pipeline file, bound to the extraction's output.
        path = os.path.join(self.tmp, "export.json")
        with open(path, "w") as f:
            json.dump({"jobs": [{"name": "files", "type": "EXPORT",
                                 "spec": {"path": "from-file.parquet",
                                          "format": "EXPORT_FORMAT_PARQUET"},
                                 "bind": {"export.dataset_id": "%d:extract.dataset_id"
                                          % dense.id}}]}, f)
        self.daemon.latentctl("pipeline", path, "--watch")
        self.assertTrue(os.path.exists(os.path.join(os.path.dirname(written.path), "..",
                                                    "from-file.parquet")))

        # Refused at submit as the RPC refuses: a path outside the export root, a device.
        with self.assertRaises(grpc.RpcError) as refused:
            c.export(dataset, "../outside.npz", job=True)
        self.assertEqual(refused.exception.code(), grpc.StatusCode.PERMISSION_DENIED)
        self.assertIn("export.path", refused.exception.details())
        with self.assertRaises(grpc.RpcError) as refused:
            c.export(dataset, "x.npz", job=True, num_devices=1)
        self.assertEqual(refused.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("spec.num_devices: EXPORT jobs hold no device", refused.exception.details())

    def test_a_pipeline_file_through_latentctl_and_again(self):
        path = os.path.join(self.tmp, "experiment.json")
        with open(path, "w") as f:
            json.dump({"name": "exp1", "jobs": [
                {"name": "dense", "type": "EXTRACT",
                 "spec": dict(self.source, mode="DENSE", valueDtype="FLOAT32")},
                {"name": "sae", "type": "TRAIN", "label": "from-file",
                 "spec": {"sae": SAE, "optimizer": OPTIMIZER, "batchSize": 64, "steps": 20},
                 "bind": {"train.dataset_id": "dense:extract.dataset_id"}},
                {"name": "latents", "type": "EXTRACT",
                 "spec": dict(self.source, mode="SPARSE"),
                 "bind": {"extract.sae.artifact_id": "sae:train.artifact_id"}}]}, f)
        plan = self.daemon.latentctl("pipeline", path, "--dry_run").stdout
        self.assertIn("dense (EXTRACT)\n  tokens: ", plan)
        self.assertIn("latents (EXTRACT, after sae)\n  extract.sae.artifact_id from sae's "
                      "train.artifact_id", plan)
        self.assertEqual(list(self.c.list()), [])  # a dry run makes nothing

        first = self.daemon.latentctl("pipeline", path, "--watch").stdout.splitlines()
        self.assertEqual([line.split()[:2] for line in first[:3]],
                         [["dense", "job"], ["sae", "job"], ["latents", "job"]])
        self.assertIn("(TRAIN, after dense)", first[1])
        self.assertEqual([line.split()[3] for line in first[3:]], ["SUCCEEDED"] * 3)
        jobs = {j.request_id: j for j in self.c.list()}
        self.assertEqual(sorted(jobs), ["exp1/dense", "exp1/latents", "exp1/sae"])
        self.assertEqual(jobs["exp1/sae"].spec.label, "from-file")
        # Run again (say, after a dropped connection): the same jobs, none made twice.
        again = self.daemon.latentctl("pipeline", path).stdout.splitlines()
        self.assertEqual(again, first[:3])
        self.assertEqual(len(list(self.c.list())), 3)

        # A file with a mistake submits nothing, and says where it is.
        with open(path, "w") as f:
            json.dump({"jobs": [{"name": "sae", "type": "TRAIN",
                                 "bind": {"train.dataset_id": "dense:extract.dataset_id"}}]}, f)
        refused = self.daemon.latentctl("pipeline", path, check=False)
        self.assertEqual(refused.returncode, 2)
        self.assertIn("jobs[0].bind.train.dataset_id: \"dense\" is no earlier job of the file "
                      "and no job id", refused.stderr)
        self.assertEqual(len(list(self.c.list())), 3)

    def test_a_cancelled_input_fails_its_waiters_and_a_bad_binding_is_refused(self):
        c = self.c
        producer, waiter = self.train_then_extract(steps=1000000)
        # A binding the schema cannot take is refused at submit, naming it.
        with self.assertRaises(grpc.RpcError) as refused:
            c.submit("EXTRACT", dict(self.source, mode="SPARSE", sae={
                "artifactId": Output(producer, "extract.dataset_id")}))
        self.assertEqual(refused.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertEqual(refused.exception.details(),
                         "spec.bindings[0].output: job %d is a TRAIN job: its outputs start "
                         "with \"train.\"" % producer.id)
        self.wait_for_state(c, producer.id, [jobs_pb2.RUNNING])
        c.cancel(producer.id)
        failed = c.wait(waiter.id)
        self.assertEqual(failed.state, jobs_pb2.FAILED)
        self.assertEqual(failed.reason, jobs_pb2.DEPENDENCY_FAILED)
        self.assertTrue(failed.message.startswith(
            "job %d, which this job waits for, is CANCELLED" % producer.id), failed.message)
        self.assertEqual(failed.attempts, 0)

    def test_what_a_waiting_job_will_read_cannot_be_deleted(self):
        c = self.c
        dense = {name: c.wait(c.submit("EXTRACT", dict(self.source, mode="DENSE",
                                                       valueDtype="FLOAT32",
                                                       datasetName=name)).id)
                 for name in ("encode-me", "train-on-me")}
        producer = c.submit("TRAIN", {
            "datasetId": str(dense["train-on-me"].result.extract.dataset_id), "sae": SAE,
            "optimizer": OPTIMIZER, "batchSize": 32, "steps": 1000000})
        # Encode one stored dataset with the SAE trained on the other, once it is trained: the
        # dataset comes from a job that has finished, the SAE from one still running, so
        # nothing is bound yet and the waiting job's spec does not name the dataset.
        waiter = c.submit("EXTRACT", {"model": {"stored": {"datasetIds": [
            Output(dense["encode-me"], "extract.dataset_id")]}}, "mode": "SPARSE",
            "sae": {"artifactId": Output(producer, "train.artifact_id")}})
        self.assertEqual(list(c.get(waiter.id).spec.extract.model.stored.dataset_ids), [])
        dataset = dense["encode-me"].result.extract.dataset_id
        refused = self.daemon.latentctl("delete-dataset", str(dataset), check=False)
        self.assertNotEqual(refused.returncode, 0)
        self.assertIn("FAILED_PRECONDITION", refused.stderr)
        self.assertIn("dataset %d (\"encode-me\") is extract.model.stored.dataset_ids[0] of "
                      "job %d (PENDING); cancel it or let it finish first"
                      % (dataset, waiter.id), refused.stderr)
        # The running TRAIN job holds the other one.
        other = dense["train-on-me"].result.extract.dataset_id
        self.assertIn("is train.dataset_id of job %d" % producer.id, self.daemon.latentctl(
            "delete-dataset", str(other), check=False).stderr)
        self.assertEqual(len(c.list_datasets()), 2)

        # Cancelling the producer fails the waiting job; nothing needs the datasets now.
        c.cancel(producer.id)
        self.assertEqual(c.wait(waiter.id).reason, jobs_pb2.DEPENDENCY_FAILED)
        self.assertEqual(c.wait(producer.id).state, jobs_pb2.CANCELLED)
        self.daemon.latentctl("delete-dataset", str(dataset))
        self.daemon.latentctl("delete-dataset", str(other))
        self.assertEqual(len(c.list_datasets()), 0)

    def test_a_pipeline_survives_kill9_of_the_daemon(self):
        c = self.c
        train, sparse = self.train_then_extract(steps=3000, seed=3, checkpointEvery=100)
        self.wait_for_state(c, train.id, [jobs_pb2.RUNNING])
        c.close()
        self.daemon.kill9()

        self.daemon.start()
        c = self.c = self.daemon.client()
        done = c.wait(sparse.id)
        self.assertEqual(done.state, jobs_pb2.SUCCEEDED, done.message)
        trained = c.get(train.id)
        self.assertEqual(trained.state, jobs_pb2.SUCCEEDED, trained.message)
        self.assertEqual(trained.attempts, 2)  # interrupted, resumed
        self.assertEqual(done.attempts, 1)  # waited through the restart, then ran once
        self.assertLessEqual(trained.finished.ToNanoseconds(), done.started.ToNanoseconds())
        self.assertIn("bound extract.sae.artifact_id = %d (job %d's train.artifact_id)"
                      % (trained.result.train.artifact_id, train.id), self.log_of(sparse.id))


if __name__ == "__main__":
    unittest.main()
