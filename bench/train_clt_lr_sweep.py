"""Learning rates for a cross-layer transcoder, one TRAIN job per (optimizer, lr) in one latentd:
the FVU every 25 steps. The spec is tests/e2e/test_train_loop.py's CLT test (a 2-block reference
model, d_model 64; blocks.L.ln2.hook_normalized -> blocks.L.hook_mlp_out; BatchTopK d_sae 256,
k 8; 150 steps of 64 rows, constant lr, seed 2) over scripts/make_demo_inputs.py's 64 sequences
of 32 tokens; M-FAC window 8, S-MFAC density 5%.

    bazel build //server:latentd //client:latentctl //proto:api_py
    PYTHONPATH=bazel-bin/proto/py:client/python:tests/e2e /usr/bin/python3 \\
        bench/train_clt_lr_sweep.py [--runs smfac:0.002,0.01,0.03,1,3,10 adam:0.003 sgd:0.1]
"""

import argparse
import os
import subprocess
import sys
import tempfile

from harness import Daemon
from latentd.v1 import jobs_pb2

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts")
MODEL = {"reference": {"dModel": 64, "nLayers": 2, "nHeads": 4, "dMlp": 256, "vocabSize": 4096,
                       "contextLength": 32, "seed": 1}}
OPTIMIZER_OPTIONS = {"smfac": {"window": 8, "density": 0.05}, "mfac": {"window": 8}}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", nargs="+",
                        default=["smfac:0.002,0.01,0.03,1,3,10", "adam:0.003", "sgd:0.1"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, os.path.join(SCRIPTS, "make_demo_inputs.py"),
                        os.path.join(tmp, "inputs"), "--sequences", "64", "--context", "32",
                        "--d_in", "64", "--d_sae", "256", "--k", "8"],
                       check=True, capture_output=True)
        daemon = Daemon(os.path.join(tmp, "d"), extra_args=["--data_roots=" + tmp]).start()
        try:
            c = daemon.client()
            source = {"model": MODEL, "hookName": "blocks.0.ln2.hook_normalized",
                      "tokens": {"path": os.path.join(tmp, "inputs", "tokens.npy"),
                                 "contextLength": 32}}
            for run in args.runs:
                name, lrs = run.split(":")
                for lr in lrs.split(","):
                    optimizer = dict(OPTIMIZER_OPTIONS.get(name, {}), name=name, lr=float(lr))
                    job = c.wait(c.submit("TRAIN", {
                        "activations": source, "targetHookName": "blocks.0.hook_mlp_out",
                        "sae": {"crossLayers": 2, "dSae": 256, "k": 8}, "optimizer": optimizer,
                        "batchSize": 64, "steps": 150, "seed": 2, "telemetryEvery": 25}).id)
                    if job.state != jobs_pb2.SUCCEEDED:
                        sys.exit("%s lr %s failed: %s" % (name, lr, job.message))
                    fvus = [e.telemetry.train.fvu for e in c.watch(job.id)
                            if e.HasField("telemetry") and e.telemetry.HasField("train")]
                    print("%-6s lr %-6s FVU every 25 steps: %s" % (
                        name, lr, " ".join("%.3f" % f for f in fvus)), flush=True)
        finally:
            daemon.stop()


if __name__ == "__main__":
    main()
