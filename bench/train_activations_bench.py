"""TRAIN on a model's activations (train.activations) against the stored path it replaces
(EXTRACT DENSE, then TRAIN on the dataset), side by side in one latentd: wall time of each job,
the dataset's bytes on disk, and how far the two SAEs are apart.

    bazel build -c opt //server:latentd //client:latentctl //proto:api_py
    PYTHONPATH=bazel-bin/proto/py:client/python:tests/e2e /usr/bin/python3 \\
        bench/train_activations_bench.py [--sequences 2048] [--epochs 1] [--devices 1] \\
        [--context 128]

The model is the X1 reference transformer (shared/notes/workloads.md: d_model 256, 4 layers,
context 128), hook blocks.2.hook_resid_post; the SAE TopK d_sae 4096, k 32, adam. With
--devices n every job holds n CPU devices (ranks), and the live job's log says how many
sequences the model ran over on them.
"""

import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile
import time

import numpy

from harness import Daemon
from latentd.v1 import jobs_pb2

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts")


def weights(path):
    with open(os.path.join(path, "sae_weights.safetensors"), "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    return {k: numpy.frombuffer(data[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]],
                                numpy.float32)
            for k, v in header.items() if k != "__metadata__"}


def timed(client, kind, spec, devices):
    start = time.time()
    job = client.wait(client.submit(kind, spec, num_devices=devices).id)
    if job.state != jobs_pb2.SUCCEEDED:
        sys.exit("%s failed: %s" % (kind, job.message))
    return job, time.time() - start


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sequences", type=int, default=2048)
    parser.add_argument("--epochs", type=float, default=1)
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--context", type=int, default=128)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, os.path.join(SCRIPTS, "make_demo_inputs.py"), tmp,
                        "--sequences", str(args.sequences), "--context", str(args.context)],
                       check=True, capture_output=True)
        daemon = Daemon(os.path.join(tmp, "d"), devices="cpu:%d" % args.devices,
                        extra_args=["--data_roots=" + tmp]).start()
        try:
            c = daemon.client()
            source = {"model": {"reference": {"contextLength": max(args.context, 128)}},
                      "hookName": "blocks.2.hook_resid_post",
                      "tokens": {"path": os.path.join(tmp, "tokens.npy"),
                                 "contextLength": args.context}}
            train = {"sae": {"architecture": "TOPK", "dSae": 4096, "k": 32},
                     "optimizer": {"name": "adam", "lr": 1e-3}, "batchSize": 1024,
                     "epochs": args.epochs, "seed": 1, "checkpointEvery": 1000,
                     "telemetryEvery": 1000}
            dense, extract_s = timed(c, "EXTRACT", dict(source, mode="DENSE",
                                                        valueDtype="FLOAT32"),
                                     args.devices)
            dataset = dense.result.extract.dataset_id
            stored, stored_s = timed(c, "TRAIN", dict(train, datasetId=str(dataset)),
                                     args.devices)
            live, live_s = timed(c, "TRAIN", dict(train, activations=source), args.devices)
            ran = [e.log.text for e in c.watch(live.id)
                   if e.HasField("log") and "the model ran over" in e.log.text]
            disk = c.get_dataset(dataset).bytes_on_disk
            a = weights(stored.result.train.artifact_path)
            b = weights(live.result.train.artifact_path)
            diff = max(float(numpy.max(numpy.abs(a[k] - b[k]))) for k in a)
        finally:
            daemon.stop()
    rows = args.sequences * args.context
    print("rows %d, epochs %g, steps %d, %d device(s)"
          % (rows, args.epochs, stored.result.train.steps, args.devices))
    print("stored: EXTRACT DENSE %.1f s + TRAIN %.1f s = %.1f s, dataset %.1f MB on disk"
          % (extract_s, stored_s, extract_s + stored_s, disk / 1e6))
    print("live:   TRAIN on activations %.1f s, 0 MB on disk (%.2fx the stored path's wall)"
          % (live_s, live_s / (extract_s + stored_s)))
    print("live:   %s" % (ran[0] if ran else "(no count in the log)"))
    print("final FVU stored %.5f, live %.5f; largest weight difference %.2g"
          % (stored.result.train.final_fvu, live.result.train.final_fvu, diff))


if __name__ == "__main__":
    main()
