"""EXTRACT over stored activations (model.stored) against the job it spares: rerunning the model
to encode the same rows with the same SAE, side by side in one latentd. Wall time and tokens/s of
each SPARSE job, what storing the DENSE rows cost once, and whether the two datasets agree.

    bazel build -c opt //server:latentd //client:latentctl //proto:api_py
    PYTHONPATH=bazel-bin/proto/py:client/python:tests/e2e /usr/bin/python3 \\
        bench/extract_stored_bench.py [--sequences 1024] [--repeats 2] [--sweep 3]

X1 workload (shared/notes/workloads.md): the reference transformer (d_model 256, 4 layers,
context 128), hook blocks.2.hook_resid_post, the TopK SAE make_demo_inputs.py writes (d_sae
4096, k 32), fp16 latents. The DENSE dataset is float32, so both SPARSE jobs encode the same
numbers: rows whose latent sets differ would be a bug, not noise. The SPARSE jobs alternate
(model, stored, model, stored, ...) so drift on a shared machine hits both alike.

With --sweep N (N >= 2): N SAEs of other seeds over the stored dataset, as one job (more_outputs:
the rows read once a batch) against N jobs of one SAE each, alternated the same way.
"""

import argparse
import os
import subprocess
import sys
import tempfile

from harness import Daemon
from train_activations_bench import timed as run_timed

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts")


def timed(client, spec):
    job, seconds = run_timed(client, "EXTRACT", spec, 1)
    return job.result.extract, seconds


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sequences", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--sweep", type=int, default=0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, os.path.join(SCRIPTS, "make_demo_inputs.py"), tmp,
                        "--sequences", str(args.sequences)], check=True, capture_output=True)
        saes = [os.path.join(tmp, "sae")]
        for seed in range(1, args.sweep):
            other = os.path.join(tmp, "seed%d" % seed)
            subprocess.run([sys.executable, os.path.join(SCRIPTS, "make_demo_inputs.py"), other,
                            "--sequences", "1", "--seed", str(seed)], check=True,
                           capture_output=True)
            saes.append(os.path.join(other, "sae"))
        daemon = Daemon(os.path.join(tmp, "d"), devices="cpu:1",
                        extra_args=["--data_roots=" + tmp]).start()
        try:
            c = daemon.client()
            run = {"model": {"reference": {}}, "hookName": "blocks.2.hook_resid_post",
                   "tokens": {"path": os.path.join(tmp, "tokens.npy"), "contextLength": 128}}
            sae = {"path": os.path.join(tmp, "sae")}
            dense, dense_s = timed(c, dict(run, mode="DENSE", valueDtype="FLOAT32"))
            stored = {"model": {"stored": {"datasetIds": [str(dense.dataset_id)]}}, "sae": sae}
            times = {"model": [], "stored": []}
            results = {}
            for _ in range(args.repeats):
                for name, spec in (("model", dict(run, sae=sae)), ("stored", stored)):
                    results[name], seconds = timed(c, spec)
                    times[name].append(seconds)
            a, _ = c.read_rows(results["model"].dataset_id)
            b, _ = c.read_rows(results["stored"].dataset_id)
            same_rows = (a != b).nnz == 0
            rows = results["model"].rows
            print("X1: %d tokens, TopK d_sae 4096 k 32, 1 CPU device; %d runs each, alternated"
                  % (rows, args.repeats))
            print("EXTRACT DENSE float32 (once): %.1f s, %.1f MB on disk"
                  % (dense_s, dense.bytes_per_token * dense.rows / 1e6))
            for name in ("model", "stored"):
                best = min(times[name])
                print("SPARSE from the %-6s: best %.2f s (%s), %.0f tokens/s"
                      % (name, best, ", ".join("%.2f" % t for t in times[name]), rows / best))
            print("stored / model wall (best of each): %.2fx; datasets identical: %s"
                  % (min(times["stored"]) / min(times["model"]), same_rows))
            if args.sweep >= 2:
                sweep = dict(stored, sae={"path": saes[0]},
                             moreOutputs=[{"sae": {"path": p}} for p in saes[1:]])
                one_job, separate = [], []
                for _ in range(args.repeats):
                    one_job.append(timed(c, sweep)[1])
                    separate.append(sum(timed(c, dict(stored, sae={"path": p}))[1]
                                        for p in saes))
                print("sweep of %d SAEs: one job best %.2f s (%s), %d jobs best %.2f s (%s): "
                      "%.2fx" % (args.sweep, min(one_job), ", ".join("%.2f" % t for t in one_job),
                                 args.sweep, min(separate),
                                 ", ".join("%.2f" % t for t in separate),
                                 min(one_job) / min(separate)))
        finally:
            daemon.stop()


if __name__ == "__main__":
    main()
