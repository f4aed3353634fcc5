"""A cross-layer transcoder over every block of the X1 reference model, trained with adam, dense
M-FAC and sparse M-FAC at 1% on the model's hooks (train.activations), side by side in one
latentd: final FVU (the batch's, at the training scale), peak optimizer state, wall time; then
each artifact run by a SPARSE EXTRACT job over the same tokens, which measures every block's
explained variance independently (circuit-tracer's reconstruction, in the hooks' own units).

    bazel build -c opt //server:latentd //client:latentctl //proto:api_py
    PYTHONPATH=bazel-bin/proto/py:client/python:tests/e2e /usr/bin/python3 \\
        bench/train_clt_bench.py [--sequences 256] [--steps 200] [--d_sae 1024] \\
        [--adam_lr 1e-3] [--mfac_lr 3] [--smfac_lr 3] [--only adam,mfac,smfac]

The model is X1's (shared/notes/workloads.md: d_model 256, 4 blocks, d_mlp 1024, context 128);
the CLT reads blocks.L.ln2.hook_normalized and predicts blocks.L.hook_mlp_out for L = 0..3,
BatchTopK with k 16 a block, batch 512 rows, cosine lr with 5% warm-up to 10%, M-FAC window 64
and damp 1e-4. The M-FACs' learning rates are far above adam's since their step shrinks as the
gradient grows and the CLT's loss sums every block's squared error at unit scale (docs/TRAIN.md,
"Cross-layer transcoders"). The daemon holds two CPU devices (the harness' default): two ranks.
"""

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time

from harness import Daemon
from latentd.v1 import jobs_pb2

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts")
LAYERS = 4


def finished(client, kind, spec):
    start = time.time()
    job = client.wait(client.submit(kind, spec).id)
    if job.state != jobs_pb2.SUCCEEDED:
        sys.exit("%s failed: %s" % (kind, job.message))
    return job, time.time() - start


@contextlib.contextmanager
def x1_daemon(sequences):
    """A latentd (the harness' two CPU devices) over demo inputs of `sequences` sequences of 128
    tokens: yields its client and the token source spec."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, os.path.join(SCRIPTS, "make_demo_inputs.py"), tmp,
                        "--sequences", str(sequences), "--context", "128"],
                       check=True, capture_output=True)
        daemon = Daemon(os.path.join(tmp, "d"), extra_args=["--data_roots=" + tmp]).start()
        try:
            yield daemon.client(), {"path": os.path.join(tmp, "tokens.npy"), "contextLength": 128}
        finally:
            daemon.stop()


def add_optimizer_args(parser):
    """--adam_lr, --mfac_lr, --smfac_lr and --only, for optimizers_from."""
    parser.add_argument("--adam_lr", type=float, default=1e-3)
    parser.add_argument("--mfac_lr", type=float, default=3.0)
    parser.add_argument("--smfac_lr", type=float, default=3.0)
    parser.add_argument("--only", default="adam,mfac,smfac")


def optimizers_from(args):
    """[(label, OptimizerSpec as JSON)] of the optimizers --only names: adam, dense M-FAC and
    S-MFAC at 1%, the M-FACs with window 64 and damp 1e-4."""
    optimizers = [
        ("adam (%g)" % args.adam_lr, {"name": "adam", "lr": args.adam_lr}),
        ("mfac, dense (%g)" % args.mfac_lr,
         {"name": "mfac", "lr": args.mfac_lr, "window": 64, "damp": 1e-4}),
        ("smfac 1%% (%g)" % args.smfac_lr,
         {"name": "smfac", "lr": args.smfac_lr, "window": 64, "damp": 1e-4, "density": 0.01}),
    ]
    return [o for o in optimizers if o[1]["name"] in args.only.split(",")]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sequences", type=int, default=256)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--d_sae", type=int, default=1024)
    add_optimizer_args(parser)
    args = parser.parse_args()
    optimizers = optimizers_from(args)
    rows = []
    with x1_daemon(args.sequences) as (c, tokens):
        model = {"reference": {}}
        for name, optimizer in optimizers:
            spec = {"activations": {"model": model,
                                    "hookName": "blocks.0.ln2.hook_normalized",
                                    "tokens": tokens},
                    "targetHookName": "blocks.0.hook_mlp_out",
                    "sae": {"crossLayers": LAYERS, "dSae": args.d_sae, "k": 16},
                    "optimizer": optimizer, "batchSize": 512, "steps": args.steps,
                    "schedule": {"kind": "COSINE", "warmupSteps": args.steps // 20,
                                 "finalLrFraction": 0.1},
                    "seed": 1, "checkpointEvery": 1000, "telemetryEvery": 25}
            train, wall = finished(c, "TRAIN", spec)
            result = train.result.train
            samples = [e.telemetry.train for e in c.watch(train.id)
                       if e.HasField("telemetry") and e.telemetry.HasField("train")]
            artifact = {"artifactId": str(result.artifact_id)}
            extract, _ = finished(c, "EXTRACT", {
                "model": model, "hookName": "blocks.0.ln2.hook_normalized",
                "tokens": tokens, "sae": artifact,
                "moreOutputs": [{"hookName": "blocks.%d.ln2.hook_normalized" % layer,
                                 "sae": artifact} for layer in range(1, LAYERS)]})
            outputs = [extract.result.extract] + list(extract.result.extract.more_outputs)
            rows.append((name, result, samples, wall,
                         [o.fit.explained_variance for o in outputs]))
    first = rows[0][2]
    print("CLT over %d blocks, d_in 256 -> d_out 256, d_sae %d a block (%s parameters), %d steps "
          "of 512 rows over %d tokens" % (LAYERS, args.d_sae, first[-1].parameter_bytes // 4,
                                         args.steps, args.sequences * 128))
    print("| optimizer | FVU after %d steps | peak optimizer state | dense M-FAC history | wall "
          "| explained variance by block (EXTRACT) |" % args.steps)
    print("|---|---|---|---|---|---|")
    for name, result, samples, wall, explained in rows:
        print("| %s | %.4f | %.1f MB | %.1f MB | %.0f s | %s |" % (
            name, result.final_fvu, result.peak_optimizer_state_bytes / 1e6,
            samples[-1].dense_mfac_history_bytes / 1e6, wall,
            " / ".join("%.3f" % e for e in explained)))
    for name, _, samples, _, _ in rows:
        print("%s FVU every 25 steps: %s" % (name, " ".join("%.3f" % s.fvu for s in samples)))


if __name__ == "__main__":
    main()
