"""The HTTP endpoint beside the gRPC port: GET /metrics (Prometheus text, parsed here with the
Prometheus project's own Python parser) and GET /healthz, with and without a token."""

import os
import subprocess
import sys
import time
import unittest
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from harness import LATENTD, DaemonTestCase
from latentd.v1 import jobs_pb2

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts")
MODEL = {"reference": {"dModel": 64, "nLayers": 2, "nHeads": 4, "dMlp": 256, "vocabSize": 4096,
                       "contextLength": 32, "seed": 1}}


def http_get(port, path, token=None):
    """(status, content type, body) of GET http://127.0.0.1:port/path."""
    request = urllib.request.Request("http://127.0.0.1:%d%s" % (port, path))
    if token is not None:
        request.add_header("Authorization", "Bearer " + token)
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.headers["Content-Type"], answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.headers["Content-Type"], error.read().decode()


def samples(text):
    """{(name, frozenset of labels): value} of an exposition, parsed by prometheus_client
    (which raises on anything that does not follow the text format)."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(parsed, name, **labels):
    return parsed.get((name, frozenset(labels.items())))


class Metrics(DaemonTestCase):
    def start(self, *extra):
        port_file = os.path.join(self.tmp, "metrics_port")
        daemon = self.start_daemon(devices="cpu:2", extra_args=[
            "--data_roots=" + self.tmp, "--metrics_listen=127.0.0.1:0",
            "--metrics_port_file=" + port_file] + list(extra))
        with open(port_file) as f:
            return daemon, int(f.read())

    def test_a_training_job_is_visible_while_it_runs_and_counted_after(self):
        daemon, port = self.start()
        status, _, body = http_get(port, "/healthz")
        self.assertEqual((status, body), (200, "serving\n"))

        inputs = os.path.join(self.tmp, "inputs")
        subprocess.run([sys.executable, os.path.join(SCRIPTS, "make_demo_inputs.py"), inputs,
                        "--sequences", "32", "--context", "32", "--d_in", "64", "--d_sae", "256",
                        "--k", "8"], check=True, capture_output=True)
        c = daemon.client()
        dense = c.wait(c.submit("EXTRACT", {
            "model": MODEL, "hookName": "blocks.1.hook_resid_post", "mode": "DENSE",
            "valueDtype": "FLOAT32",
            "tokens": {"path": os.path.join(inputs, "tokens.npy"), "contextLength": 32}}).id)
        self.assertEqual(dense.state, jobs_pb2.SUCCEEDED, dense.message)
        # Far more steps than the test waits for: it is cancelled once seen.
        train = c.submit("TRAIN", {
            "datasetId": str(dense.result.extract.dataset_id),
            "sae": {"architecture": "TOPK", "dSae": 256, "k": 8},
            "optimizer": {"name": "smfac", "lr": 1e-3, "damp": 1e-4, "window": 8,
                          "density": 0.05},
            "batchSize": 32, "steps": 1000000, "telemetryEvery": 2}, label="metrics \"run\"")
        job = str(train.id)

        deadline = time.time() + 120
        parsed = {}
        while time.time() < deadline:
            status, content_type, text = http_get(port, "/metrics")
            self.assertEqual(status, 200)
            self.assertEqual(content_type, "text/plain; version=0.0.4; charset=utf-8")
            parsed = samples(text)
            if (value(parsed, "latentd_train_step", job=job, type="train") or 0) >= 4:
                break
            time.sleep(0.05)
        self.assertGreaterEqual(value(parsed, "latentd_train_step", job=job, type="train"), 4,
                                text)
        self.assertEqual(value(parsed, "latentd_jobs", type="train", state="running"), 1)
        self.assertEqual(value(parsed, "latentd_jobs", type="extract", state="succeeded"), 1)
        self.assertEqual(value(parsed, "latentd_jobs", type="probe", state="failed"), 0)
        self.assertEqual(value(parsed, "latentd_job_info", job=job, type="train",
                               label="metrics \"run\"", state="running", devices="cpu:0"), 1)
        self.assertEqual(value(parsed, "latentd_device_busy", device="cpu:0"), 1)
        self.assertEqual(value(parsed, "latentd_device_busy", device="cpu:1"), 0)
        self.assertGreater(value(parsed, "latentd_process_resident_memory_bytes"), 0)
        self.assertGreater(value(parsed, "latentd_store_bytes_on_disk"), 0)
        self.assertEqual(value(parsed, "latentd_job_units_total", job=job, type="train",
                               unit="steps"), 1000000)
        components = {dict(labels)["component"]: v for (name, labels), v in parsed.items()
                      if name == "latentd_train_optimizer_state_bytes"}
        self.assertGreater(len(components), 1, components)
        dense_history = value(parsed, "latentd_train_dense_mfac_history_bytes", job=job,
                              type="train")
        self.assertLess(sum(components.values()), dense_history)
        scraped_step = value(parsed, "latentd_train_step", job=job, type="train")
        scraped_loss = value(parsed, "latentd_train_loss", job=job, type="train")

        # A poller of GetJob sees a sample as new as the scrape's, or newer.
        self.assertGreaterEqual(c.get(train.id).latest_telemetry.train.step, scraped_step)
        c.cancel(train.id)
        cancelled = self.wait_for_state(c, train.id, [jobs_pb2.CANCELLED])
        # The scrape showed one of the job's own telemetry samples, figure for figure.
        telemetry = {e.telemetry.train.step: e.telemetry.train for e in c.watch(train.id)
                     if e.HasField("telemetry") and e.telemetry.HasField("train")}
        self.assertIn(int(scraped_step), telemetry)
        sample = telemetry[int(scraped_step)]
        self.assertAlmostEqual(scraped_loss, sample.loss, delta=1e-9 * abs(sample.loss))
        self.assertEqual(components, {k: float(v) for k, v in sample.optimizer_state_bytes.items()})

        parsed = samples(http_get(port, "/metrics")[2])
        self.assertEqual(value(parsed, "latentd_jobs", type="train", state="cancelled"), 1)
        self.assertEqual(value(parsed, "latentd_jobs", type="train", state="running"), 0)
        self.assertIsNone(value(parsed, "latentd_train_step", job=job, type="train"))
        self.assertEqual(value(parsed, "latentd_device_busy", device="cpu:0"), 0)
        self.assertEqual(cancelled.state, jobs_pb2.CANCELLED)

        self.assertEqual(http_get(port, "/nothing")[0], 404)
        # Once shutdown begins, probes hear it; the port closes with the daemon.
        self.assertEqual(daemon.terminate(), 0)
        with self.assertRaises(OSError):
            http_get(port, "/healthz")

    def test_with_a_token_metrics_need_it_and_healthz_does_not(self):
        token_file = os.path.join(self.tmp, "token")
        with open(token_file, "w") as f:
            f.write("scrape-me\n")
        _, port = self.start("--auth_token_file=" + token_file)
        status, _, body = http_get(port, "/metrics")
        self.assertEqual(status, 401)
        self.assertIn("Authorization: Bearer", body)
        self.assertEqual(http_get(port, "/metrics", token="scrape-m")[0], 401)
        status, _, text = http_get(port, "/metrics", token="scrape-me")
        self.assertEqual(status, 200)
        self.assertEqual(value(samples(text), "latentd_jobs", type="extract", state="pending"), 0)
        self.assertEqual(http_get(port, "/healthz")[0], 200)

    def test_off_loopback_without_a_token_is_refused_at_start(self):
        result = subprocess.run(
            [LATENTD, "--listen=127.0.0.1:0", "--data_dir=" + os.path.join(self.tmp, "d"),
             "--devices=cpu:1", "--metrics_listen=0.0.0.0:0"],
            capture_output=True, text=True, timeout=60)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("--metrics_listen=0.0.0.0:0 is not a loopback address", result.stderr)


if __name__ == "__main__":
    unittest.main()
