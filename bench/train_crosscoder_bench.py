"""An acausal crosscoder over the residual stream after every block of the X1 reference model,
trained with adam, dense M-FAC and sparse M-FAC at 1% on the model's hooks (train.activations
with train.crosscoder_hooks), side by side in one latentd: final FVU and each block's (the last
batch's, at the training scale), peak optimizer state, wall time, and how the latents split
between the blocks (TrainResult.crosscoder).

    bazel build -c opt //server:latentd //client:latentctl //proto:api_py
    PYTHONPATH=bazel-bin/proto/py:client/python:tests/e2e /usr/bin/python3 \\
        bench/train_crosscoder_bench.py [--sequences 256] [--steps 200] [--d_sae 1024] [--k 32] \\
        [--adam_lr 1e-3] [--mfac_lr 3] [--smfac_lr 3] [--only adam,mfac,smfac]

The model is X1's (shared/notes/workloads.md: d_model 256, 4 blocks, context 128); the
crosscoder reads and reconstructs blocks.L.hook_resid_post for L = 0..3 (a row of 4 x 256
values), BatchTopK with k latents a row, batch 512 rows, cosine lr with 5% warm-up to 10%,
M-FAC window 64 and damp 1e-4. The daemon holds two CPU devices (the harness' default): two
ranks, which share the forward passes.
"""

import argparse

from train_clt_bench import add_optimizer_args, finished, optimizers_from, x1_daemon

LAYERS = 4


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sequences", type=int, default=256)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--d_sae", type=int, default=1024)
    parser.add_argument("--k", type=int, default=32)
    add_optimizer_args(parser)
    args = parser.parse_args()
    optimizers = optimizers_from(args)
    rows = []
    with x1_daemon(args.sequences) as (c, tokens):
        for name, optimizer in optimizers:
            spec = {"activations": {"model": {"reference": {}},
                                    "hookName": "blocks.0.hook_resid_post",
                                    "tokens": tokens},
                    "crosscoderHooks": ["blocks.%d.hook_resid_post" % layer
                                        for layer in range(1, LAYERS)],
                    "sae": {"dSae": args.d_sae, "k": args.k},
                    "optimizer": optimizer, "batchSize": 512, "steps": args.steps,
                    "schedule": {"kind": "COSINE", "warmupSteps": args.steps // 20,
                                 "finalLrFraction": 0.1},
                    "seed": 1, "checkpointEvery": 1000, "telemetryEvery": 25}
            train, wall = finished(c, "TRAIN", spec)
            samples = [e.telemetry.train for e in c.watch(train.id)
                       if e.HasField("telemetry") and e.telemetry.HasField("train")]
            rows.append((name, train.result.train, samples, wall))
    first = rows[0][2]
    print("Crosscoder over blocks.0..%d.hook_resid_post of X1 (%d x 256 values a row), d_sae %d, "
          "k %d (%d parameters), %d steps of 512 rows over %d tokens" % (
              LAYERS - 1, LAYERS, args.d_sae, args.k, first[-1].parameter_bytes // 4, args.steps,
              args.sequences * 128))
    print("| optimizer (lr) | FVU after %d steps | by block | peak optimizer state | dense M-FAC "
          "history | wall | latents: live / each block's own / shared |" % args.steps)
    print("|---|---|---|---|---|---|---|")
    for name, result, samples, wall in rows:
        summary = result.crosscoder
        print("| %s | %.4f | %s | %.1f MB | %.1f MB | %.0f s | %d / %s / %d |" % (
            name, result.final_fvu, " / ".join("%.3f" % f for f in result.final_block_fvu),
            result.peak_optimizer_state_bytes / 1e6, samples[-1].dense_mfac_history_bytes / 1e6,
            wall, summary.live_latents, " ".join(str(n) for n in summary.exclusive_latents),
            summary.shared_latents))
    for name, _, samples, _ in rows:
        print("%s FVU every 25 steps: %s" % (name, " ".join("%.3f" % s.fvu for s in samples)))


if __name__ == "__main__":
    main()
