"""EXTRACT DENSE of the X1 reference model (hook blocks.2.hook_resid_post, fp16 values) at one
context length with several batch_sequences, alternated twice, on a one-CPU latentd:

    bazel build //server:latentd //client:latentctl //proto:api_py
    PYTHONPATH=bazel-bin/proto/py:client/python:tests/e2e /usr/bin/python3 \\
        bench/extract_batch_bench.py CONTEXT SEQUENCES B1,B2,...

A batch of 0 is the default (DefaultBatchSequences in engine/extract_runner.h).
"""
import os, subprocess, sys, tempfile, time
from harness import Daemon
from latentd.v1 import jobs_pb2
ctx, seqs = int(sys.argv[1]), int(sys.argv[2]); batches = [int(b) for b in sys.argv[3].split(",")]
with tempfile.TemporaryDirectory() as tmp:
    subprocess.run([sys.executable, "scripts/make_demo_inputs.py", tmp, "--sequences", str(seqs),
                    "--context", str(ctx)], check=True, capture_output=True)
    d = Daemon(os.path.join(tmp, "d"), devices="cpu:1", extra_args=["--data_roots=" + tmp]).start()
    try:
        c = d.client()
        for rep in range(2):
            for b in batches:
                spec = {"model": {"reference": {"contextLength": max(ctx, 128)}},
                        "hookName": "blocks.2.hook_resid_post", "mode": "DENSE", "valueDtype": "FLOAT16",
                        "tokens": {"path": os.path.join(tmp, "tokens.npy"), "contextLength": ctx},
                        "batchSequences": b, "datasetName": "b%d_%d" % (b, rep)}
                t = time.time(); job = c.wait(c.submit("EXTRACT", spec).id)
                assert job.state == jobs_pb2.SUCCEEDED, job.message
                print("context %d batch_sequences %d: %.1f s" % (ctx, b, time.time() - t), flush=True)
    finally:
        d.stop()
