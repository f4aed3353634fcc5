"""EXTRACT through the daemon: kill -9 mid-job, restart, and the dataset equals, row for row, that of
an uninterrupted run, for 1 and 2 devices (issue: EXTRACT jobs, "Resume"), also for a job that
fills two hooks' datasets from one forward pass (more_outputs), and for tokens read from a
Hugging Face-style directory of Parquet shards; and a cancelled job's dataset, continued by a new
job (resume_from_job_id), ends the same. A dataset saved to disk by Hugging Face datasets (Arrow
shards) gives the rows of the same ids in a .npy."""

import json
import os
import re
import shutil
import subprocess
import sys
import time
import unittest

import numpy as np

from harness import DaemonTestCase
from latentd.v1 import jobs_pb2

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts")
SEQUENCES = 192
CONTEXT = 64


def extract_spec(inputs, name, commit_rows=512, more_outputs=False):
    spec = {
        "model": {"reference": {"dModel": 128, "nLayers": 3, "nHeads": 4, "dMlp": 512,
                                "vocabSize": 4096, "contextLength": CONTEXT, "seed": 7}},
        "hookName": "blocks.1.hook_resid_post",
        "tokens": {"path": os.path.join(inputs, "tokens.npy"), "contextLength": CONTEXT},
        "sae": {"path": os.path.join(inputs, "sae")},
        "mode": "SPARSE",
        "batchSequences": 4,
        "commitRows": commit_rows,
        "datasetName": name,
    }
    if more_outputs:
        # A second hook of the same forward pass, into a dataset of its own.
        spec["moreOutputs"] = [{"hookName": "blocks.0.hook_resid_mid",
                                "sae": {"path": os.path.join(inputs, "sae")}}]
    return spec


class ExtractResume(DaemonTestCase):
    def wait_mid_job(self, client, job_id, before, what):
        """Returns once the job runs with some rows committed and fewer than `before`."""
        deadline = time.time() + 300
        while time.time() < deadline:
            j = client.get(job_id)
            if j.state == jobs_pb2.RUNNING and 0 < j.progress.units_done < before:
                return
            self.assertNotEqual(j.state, jobs_pb2.SUCCEEDED, "finished before it " + what)
            time.sleep(0.005)
        self.fail("no commit within 300 s")

    def kill_and_resume(self, daemon, client, job_id):
        """kill -9 the daemon, start it again; the job must end SUCCEEDED on its second attempt.
        Returns the new client and the finished job."""
        client.close()
        daemon.kill9()
        daemon.start()
        client = daemon.client()
        final = client.wait(job_id)
        self.assertEqual(final.state, jobs_pb2.SUCCEEDED, final.message)
        self.assertEqual(final.attempts, 2)
        return client, final

    def assert_same_rows(self, client, reference_id, dataset_id):
        a, a_tokens = client.read_rows(reference_id)
        b, b_tokens = client.read_rows(dataset_id)
        self.assertEqual(a.shape, b.shape)
        np.testing.assert_array_equal(a_tokens, b_tokens)
        np.testing.assert_array_equal(a.indptr, b.indptr)
        np.testing.assert_array_equal(a.indices, b.indices)
        np.testing.assert_array_equal(a.data, b.data)
        return b, b_tokens

    def make_inputs(self):
        inputs = os.path.join(self.tmp, "inputs")
        subprocess.run([sys.executable, os.path.join(SCRIPTS, "make_demo_inputs.py"), inputs,
                        "--sequences", str(SEQUENCES), "--context", str(CONTEXT), "--d_in", "128",
                        "--d_sae", "1024", "--k", "16", "--seed", "3"],
                       check=True, capture_output=True)
        return inputs

    def run_case(self, devices, more_outputs=False):
        inputs = self.make_inputs()
        daemon = self.start_daemon(name="d%d" % devices, devices="cpu:%d" % devices,
                                   extra_args=["--data_roots=" + self.tmp])
        client = daemon.client()
        reference = client.wait(client.submit(
            "EXTRACT", extract_spec(inputs, "uninterrupted", more_outputs=more_outputs),
            num_devices=devices).id)
        self.assertEqual(reference.state, jobs_pb2.SUCCEEDED, reference.message)
        total = SEQUENCES * CONTEXT
        self.assertEqual(reference.result.extract.rows, total)

        job = client.submit("EXTRACT", extract_spec(inputs, "killed", more_outputs=more_outputs),
                            num_devices=devices)
        # Kill once at least one commit landed and the job is not done.
        self.wait_mid_job(client, job.id, total, "could be killed")
        done_at_kill = client.get(job.id).progress.units_done
        client, final = self.kill_and_resume(daemon, client, job.id)
        # The second attempt resumed: its first progress report is past zero.
        events = list(client.watch(job.id))
        runs = [i for i, e in enumerate(events) if e.HasField("state")
                and e.state.state == jobs_pb2.RUNNING]
        resumed = [e.progress.units_done for e in events[runs[1]:] if e.HasField("progress")]
        self.assertGreater(resumed[0], 0, "second attempt started from row 0")
        self.assertLessEqual(resumed[0], max(done_at_kill, resumed[0]))

        pairs = [(reference.result.extract.dataset_id, final.result.extract.dataset_id)]
        if more_outputs:
            more = final.result.extract.more_outputs
            self.assertEqual([m.dataset_name for m in more], ["killed.blocks.0.hook_resid_mid"])
            self.assertEqual(more[0].rows, total)
            pairs.append((reference.result.extract.more_outputs[0].dataset_id,
                          more[0].dataset_id))
            self.assertEqual(client.get_dataset(more[0].dataset_id).hook_name,
                             "blocks.0.hook_resid_mid")
        for reference_id, final_id in pairs:
            b, _ = self.assert_same_rows(client, reference_id, final_id)
            self.assertEqual(b.shape, (total, 1024))
        # An explanation belongs to a latent of the SAE: the resumed run's dataset, of the same
        # SAE, takes the reference's over (latentctl, then Python replacing its own).
        reference_id, final_id = pairs[0]
        daemon.latentctl("explain", str(reference_id), "7", "--text=seven", "--score=0.5")
        copied = daemon.latentctl("explain", str(final_id),
                                  "--from_dataset=%d" % reference_id).stdout
        self.assertEqual(copied.strip(), "dataset %d: stored 1 explanation; 1 latents "
                         "explained" % final_id)
        explanation = client.get_latent(final_id, 7).explanation
        self.assertEqual((explanation.text, explanation.score), ("seven", 0.5))
        client.set_explanations(final_id, {9: "nine"})
        answer = client.copy_explanations(final_id, reference_id, replace_all=True)
        self.assertEqual((answer.stored, answer.explained), (1, 1))
        if more_outputs:  # two hooks, two different matrices
            first, _ = client.read_rows(pairs[0][1])
            second, _ = client.read_rows(pairs[1][1])
            self.assertFalse(np.array_equal(first.indices, second.indices))
            # Which latents of the second hook fire where a latent of the first fires: counted
            # against the two matrices by hand.
            latent = int(np.bincount(first.indices).argmax())
            rows = np.flatnonzero(first[:, latent].toarray().ravel())
            answer = client.latents_on_rows(pairs[0][1], with_latent=latent,
                                            in_dataset=pairs[1][1], limit=50, max_rows=total)
            self.assertEqual(answer.rows_selected, len(rows))
            self.assertEqual(answer.rows_read, len(rows))
            counts = np.bincount(second[rows].indices, minlength=second.shape[1])
            self.assertGreater(len(answer.latents), 0)
            for entry in answer.latents:
                self.assertEqual(entry.count, counts[entry.latent])
            self.assertEqual(answer.latents[0].count, counts.max())
            # One prompt through both hooks: a JSON line per dataset, each the answer of that
            # dataset's own EncodePrompt.
            tokens = [int(t) for t in client.read_rows(pairs[0][1], 0, 6)[1]]
            lines = daemon.latentctl("--json", "prompt", str(pairs[0][1]),
                                     *[str(t) for t in tokens], "--limit=4",
                                     "--all_hooks").stdout.splitlines()
            self.assertEqual(len(lines), 2)
            for line, dataset_id in zip(lines, (pairs[0][1], pairs[1][1])):
                want = client.encode_prompt(dataset_id, tokens, latents_per_token=5,
                                            top_latents=4)
                got = json.loads(line)
                self.assertEqual([int(l["latent"]) for l in got["topLatents"]],
                                 [l.latent for l in want.top_latents])
            # A probe of where the first hook's latent fires, through both hooks with one split:
            # a line per hook, each that dataset's own SparseProbe.
            labelled = os.path.join(self.tmp, "fires.txt")
            others = os.path.join(self.tmp, "silent.txt")
            np.savetxt(labelled, rows, fmt="%d")
            np.savetxt(others, np.setdiff1d(np.arange(total), rows), fmt="%d")
            probed = daemon.latentctl("probe", str(pairs[0][1]), "--rows_file=" + labelled,
                                      "--versus_file=" + others, "--ks=1,2",
                                      "--all_hooks").stdout.splitlines()
            by_hook = probed[probed.index("held-out balanced accuracy by hook (the same "
                                          "split):") + 2:]
            self.assertEqual(len(by_hook), 2)
            for line, dataset_id in zip(by_hook, (pairs[0][1], pairs[1][1])):
                want = client.sparse_probe(dataset_id, rows=rows,
                                           versus_rows=np.setdiff1d(np.arange(total), rows),
                                           ks=(1, 2))
                self.assertTrue(line.startswith("dataset %d (" % dataset_id), line)
                self.assertEqual(line.split()[-2:], ["%.4f" % v
                                                     for v in want["test_balanced_accuracy"]])
            # A dashboard of the first hook's dataset: each page has the same table for the
            # second hook's dataset, under its name, its latents ranked by F1 (the latent's
            # counterparts there first).
            board = os.path.join(self.tmp, "board")
            daemon.latentctl("dashboard", str(pairs[0][1]), board, "--order=frequent",
                             "--limit=2")
            pages = [p for p in os.listdir(board) if p.startswith("latent-")]
            self.assertEqual(len(pages), 2)
            for page in pages:
                with open(os.path.join(board, page), encoding="utf-8") as f:
                    html = f.read()
                heading = ("Fires with, in dataset %d (killed.blocks.0.hook_resid_mid)"
                           % pairs[1][1])
                self.assertIn(heading, html)
                latent = int(page[len("latent-"):-len(".html")])
                want = client.latents_on_rows(pairs[0][1], with_latent=latent,
                                              in_dataset=pairs[1][1], order="f1", limit=10)
                table = html.split(heading, 1)[1].split("<h2>", 1)[0]
                shown = re.findall(r"<tr><td>(\d+)</td>", table)
                self.assertTrue(shown)
                self.assertEqual([int(l) for l in shown], [l.latent for l in want.latents])

    def test_resume_one_device(self):
        self.run_case(1)

    def test_cancelled_job_is_continued_by_a_new_job(self):
        inputs = self.make_inputs()
        daemon = self.start_daemon(name="continue", devices="cpu:1",
                                   extra_args=["--data_roots=" + self.tmp])
        client = daemon.client()
        reference = client.wait(client.submit("EXTRACT", extract_spec(inputs, "whole")).id)
        self.assertEqual(reference.state, jobs_pb2.SUCCEEDED, reference.message)
        total = SEQUENCES * CONTEXT
        job = client.submit("EXTRACT", extract_spec(inputs, "halted"))
        self.wait_mid_job(client, job.id, total // 2, "was cancelled")
        client.cancel(job.id)
        cancelled = client.wait(job.id)
        self.assertEqual(cancelled.state, jobs_pb2.CANCELLED, cancelled.message)
        self.assertIn("resume_from_job_id %d" % job.id, cancelled.message)
        spec = extract_spec(inputs, "")
        del spec["datasetName"]  # the continued job's dataset
        spec["resumeFromJobId"] = str(job.id)
        continued = client.wait(client.submit("EXTRACT", spec).id)
        self.assertEqual(continued.state, jobs_pb2.SUCCEEDED, continued.message)
        dataset = continued.result.extract.dataset_id
        self.assertEqual(client.get_dataset(dataset).name, "halted")
        self.assertEqual(client.get_dataset(dataset).job_id, continued.id)
        self.assert_same_rows(client, reference.result.extract.dataset_id, dataset)

    def test_parquet_shards_resume_to_the_rows_of_the_same_ids_in_a_npy(self):
        # Two shards written by arrow-rs (SNAPPY dictionary pages with an empty and a null list;
        # LZ4_RAW uint16 ids), named as the Hub names them, read through a pattern; the same ids
        # in a .npy make the reference run. The job is killed mid-way and resumes.
        inputs = self.make_inputs()
        fixtures = os.path.join(os.getcwd(), "common", "testdata", "parquet")
        shards = os.path.join(self.tmp, "hub", "data")
        os.makedirs(shards)
        ids = []
        for i, name in enumerate(["snappy_dictionary", "lz4_uint16"]):
            shutil.copy(os.path.join(fixtures, name + ".parquet"),
                        os.path.join(shards, "train-%05d-of-00002.parquet" % i))
            ids.append(np.fromfile(os.path.join(fixtures, name + ".u32"), dtype="<u4"))
        np.save(os.path.join(self.tmp, "same_ids.npy"), np.concatenate(ids).astype(np.int32))
        total = (sum(len(x) for x in ids) // CONTEXT) * CONTEXT

        def spec(tokens_path, name):
            s = extract_spec(inputs, name, commit_rows=256)
            s["model"]["reference"]["vocabSize"] = 65536  # the fixtures' ids reach 65534
            s["tokens"]["path"] = tokens_path
            return s

        daemon = self.start_daemon(name="parquet", devices="cpu:1",
                                   extra_args=["--data_roots=" + self.tmp])
        client = daemon.client()
        reference = client.wait(client.submit(
            "EXTRACT", spec(os.path.join(self.tmp, "same_ids.npy"), "npy")).id)
        self.assertEqual(reference.state, jobs_pb2.SUCCEEDED, reference.message)
        self.assertEqual(reference.result.extract.rows, total)
        job = client.submit("EXTRACT", spec(os.path.join(shards, "train-*.parquet"), "parquet"))
        self.wait_mid_job(client, job.id, total, "could be killed")
        client, final = self.kill_and_resume(daemon, client, job.id)
        dataset = client.get_dataset(final.result.extract.dataset_id)
        self.assertIn("[input_ids, 2 files]", dataset.token_source)
        b, b_tokens = self.assert_same_rows(client, reference.result.extract.dataset_id,
                                            final.result.extract.dataset_id)
        self.assertEqual(b.shape[0], total)
        np.testing.assert_array_equal(b_tokens, np.concatenate(ids)[:total])

    def test_a_dataset_saved_to_disk_by_hf_datasets_equals_its_ids_in_a_npy(self):
        # save_to_disk's layout: data-0000i-of-00002.arrow (the stream format, written here by
        # Apache Arrow's JavaScript implementation) beside its JSON files; the directory is the
        # path.
        inputs = self.make_inputs()
        fixture = os.path.join(os.getcwd(), "common", "testdata", "arrow", "datasets_stream")
        saved = os.path.join(self.tmp, "saved")
        os.makedirs(saved)
        for i in range(2):
            shutil.copy(fixture + ".arrow", os.path.join(saved, "data-%05d-of-00002.arrow" % i))
        for name in ["state.json", "dataset_info.json"]:
            with open(os.path.join(saved, name), "w") as f:
                f.write("{}")
        ids = np.tile(np.fromfile(fixture + ".u32", dtype="<u4"), 2)
        np.save(os.path.join(self.tmp, "same_ids.npy"), ids.astype(np.int32))
        total = (len(ids) // CONTEXT) * CONTEXT
        daemon = self.start_daemon(name="arrow", devices="cpu:1",
                                   extra_args=["--data_roots=" + self.tmp])
        client = daemon.client()
        jobs = []
        for path, name in [(os.path.join(self.tmp, "same_ids.npy"), "npy"), (saved, "arrow")]:
            spec = extract_spec(inputs, name)
            spec["model"]["reference"]["vocabSize"] = 65536
            spec["tokens"]["path"] = path
            job = client.wait(client.submit("EXTRACT", spec).id)
            self.assertEqual(job.state, jobs_pb2.SUCCEEDED, job.message)
            jobs.append(job)
        self.assertIn("[input_ids, 2 files]",
                      client.get_dataset(jobs[1].result.extract.dataset_id).token_source)
        _, tokens = self.assert_same_rows(client, jobs[0].result.extract.dataset_id,
                                          jobs[1].result.extract.dataset_id)
        np.testing.assert_array_equal(tokens, ids[:total])

    def test_resume_two_devices_two_hooks(self):
        self.run_case(2, more_outputs=True)


if __name__ == "__main__":
    unittest.main()
