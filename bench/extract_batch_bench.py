"""EXTRACT DENSE of the X1 reference model (hook blocks.2.hook_resid_post, fp16 values) at one
context length with several batch_sequences, alternated twice, on a one-CPU latentd:

    bazel build //server:latentd //client:latentctl //proto:api_py
    PYTHONPATH=bazel-bin/proto/py:client/python:tests/e2e /usr/bin/python3 \\
        bench/extract_batch_bench.py CONTEXT SEQUENCES B1,B2,...

A batch of 0 is the default (DefaultBatchSequences in engine/extract_runner.h).
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time

from harness import Daemon
from latentd.v1 import jobs_pb2

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("context", type=int)
    parser.add_argument("sequences", type=int)
    parser.add_argument("batches", help="batch_sequences values, comma-separated (0: default)")
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, os.path.join(SCRIPTS, "make_demo_inputs.py"), tmp,
                        "--sequences", str(args.sequences), "--context", str(args.context)],
                       check=True, capture_output=True)
        daemon = Daemon(os.path.join(tmp, "d"), devices="cpu:1",
                        extra_args=["--data_roots=" + tmp]).start()
        try:
            c = daemon.client()
            for rep in range(2):
                for batch in batches:
                    spec = {"model": {"reference": {"contextLength": max(args.context, 128)}},
                            "hookName": "blocks.2.hook_resid_post", "mode": "DENSE",
                            "valueDtype": "FLOAT16", "batchSequences": batch,
                            "tokens": {"path": os.path.join(tmp, "tokens.npy"),
                                       "contextLength": args.context},
                            "datasetName": "b%d_%d" % (batch, rep)}
                    start = time.time()
                    job = c.wait(c.submit("EXTRACT", spec).id)
                    if job.state != jobs_pb2.SUCCEEDED:
                        sys.exit("EXTRACT failed: %s" % job.message)
                    print("context %d batch_sequences %d: %.1f s"
                          % (args.context, batch, time.time() - start), flush=True)
        finally:
            daemon.stop()


if __name__ == "__main__":
    main()
