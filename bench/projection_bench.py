"""A direction projected on a DENSE dataset's rows two ways, side by side in one run against one
latentd on loopback:

  daemon  Client.project_rows: the Datasets.ProjectRows RPC, one pass over the stored rows,
          holding a float and a token id per row (storage/dense_projection);
  client  what users do today: the rows exported to .npz on the server (the one way the
          Python client reads DENSE rows), loaded into RAM with numpy, projected with a matrix
          product and ranked with argsort.

The dataset is the X1 reference transformer's blocks.2.hook_resid_post hidden states (d 256,
fp16; bench/x1_sparse.py, DENSE) over `--sequences` sequences of 128 tokens; the direction is
a seeded Gaussian vector; both sides list the 20 largest and 20 smallest rows.

    bazel build //server:latentd //client:latentctl //proto:api_py
    PYTHONPATH=bazel-bin/proto/py:client/python:tests/e2e /usr/bin/python3 \\
        bench/projection_bench.py [--sequences 1024] [--repeats 3]
"""

import os
import time

import numpy as np

import x1_sparse

TOP = 20


def main():
    args = x1_sparse.arguments().parse_args()
    direction = np.random.default_rng(0).standard_normal(256).astype(np.float32)
    with x1_sparse.served(args.sequences, "projection-bench", mode="DENSE") as (client, dataset):
        times = {"daemon": [], "client": []}
        for repeat in range(args.repeats):  # alternating, so drift hits both alike
            start = time.perf_counter()
            answer = client.project_rows(dataset, direction, top_n=TOP)
            times["daemon"].append(time.perf_counter() - start)

            start = time.perf_counter()
            written = client.export(dataset, "projection-bench-%d.npz" % repeat).path
            hidden = np.load(written)["data"]
            projected = hidden.astype(np.float32) @ direction
            order = np.argsort(-projected, kind="stable")
            largest, smallest = order[:TOP], order[::-1][:TOP]
            times["client"].append(time.perf_counter() - start)
            client_bytes = hidden.nbytes + projected.nbytes
            os.remove(written)

        same = ([t.row for t in answer.largest] == largest.tolist() and
                sorted(t.row for t in answer.smallest) == sorted(smallest.tolist()))
        gap = float(np.max(np.abs(np.array([t.value for t in answer.largest]) -
                                  projected[largest])))
        best = {side: min(t) for side, t in times.items()}
        print("dataset: %d rows x 256 (fp16), direction: seeded Gaussian" % answer.rows)
        print("way      best s    all runs                 held in memory")
        print("daemon   %7.3f   %-24s %.1f MiB (a float and a token id per row)" % (
            best["daemon"], " ".join("%.3f" % t for t in times["daemon"]),
            answer.rows * 8 / 2**20))
        print("client   %7.3f   %-24s %.1f MiB (the rows as numpy loads them)" % (
            best["client"], " ".join("%.3f" % t for t in times["client"]), client_bytes / 2**20))
        print("client / daemon: x%.1f; the same %d largest rows: %s (largest |value diff| %.2g)"
              % (best["client"] / best["daemon"], TOP, same, gap))


if __name__ == "__main__":
    main()
