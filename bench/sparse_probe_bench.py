"""k-sparse probing two ways, side by side in one run against one latentd on loopback:

  daemon  Client.sparse_probe: the Datasets.SparseProbe RPC, computed where the rows lie
          (storage/sparse_probe: the rows read in place, a sparse Newton fit in C++);
  client  the Python client's probe before it: the labelled rows read through ReadRows
          (packed, spans under 4096 rows apart in one read), pooled with scipy, the logistic
          fits in numpy (kept here as the baseline, on the daemon's own split and latents so
          that the two answers can be compared).

Two probes of a label no one latent gives away (the row holds one of 8 tokens of middling
frequency): the rows with it against the rows without (every row of the dataset, a span per
run of either), and, pooled by mean, the sequences holding more of them than the median
sequence against those holding fewer (SAEBench's document probe). ks 1, 2, 5, 10, 20.

With --orientations N, it then asks each probe both ways round (the class given as positive,
then the other) under each selection rule, and prints the held-out balanced accuracy per k,
averaged over N seeds: a rule that reads the classes alike gives the same figures both ways.

The dataset is a real EXTRACT of the X1 reference transformer (docs/EXTRACT.md) with a TopK SAE
(k = 32, d_sae = 4096, fp16): bench/x1_sparse.py.

    bazel build //server:latentd //client:latentctl //proto:api_py
    PYTHONPATH=bazel-bin/proto/py:client/python:tests/e2e /usr/bin/python3 \\
        bench/sparse_probe_bench.py [--sequences 1024] [--repeats 3] [--orientations 6]
"""

import time

import numpy as np
import scipy.sparse

import x1_sparse

KS = (1, 2, 5, 10, 20)


def rows_of_spans(client, dataset_id, spans, gap=4096):
    """The rows of ascending (start, count) spans as one CSR matrix, spans less than `gap` rows
    apart read through one ReadRows of their cover."""
    parts, group = [], []

    def read(group):
        first, end = group[0][0], group[-1][0] + group[-1][1]
        matrix, _ = client.read_rows(dataset_id, first, end - first)
        take = np.concatenate([np.arange(s - first, s - first + n) for s, n in group])
        parts.append(matrix[take])

    for span in spans:
        if group and span[0] - (group[-1][0] + group[-1][1]) >= gap:
            read(group)
            group = []
        group.append(span)
    if group:
        read(group)
    return scipy.sparse.vstack(parts).tocsr()


def pooled(rows, context_length, pool):
    if pool is None:
        return rows
    sequences = rows.shape[0] // context_length
    averaging = scipy.sparse.kron(scipy.sparse.identity(sequences, format="csr"),
                                  np.full((1, context_length), 1.0 / context_length))
    return (averaging @ rows).tocsr()


def fit_logistic(x, y, l2, iterations=100):
    """Newton's method on the log loss + l2 / 2 |w|^2 of standardized columns."""
    design = np.hstack([x, np.ones((x.shape[0], 1))])
    penalty = np.full(design.shape[1], float(l2))
    penalty[-1] = 0.0
    w = np.zeros(design.shape[1])
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-np.clip(design @ w, -50, 50)))
        gradient = design.T @ (p - y) + penalty * w
        hessian = (design * (p * (1 - p))[:, None]).T @ design + np.diag(penalty)
        step = np.linalg.solve(hessian + 1e-12 * np.eye(len(w)), gradient)
        w -= step
        if np.max(np.abs(step)) < 1e-10:
            break
    return w[:-1], w[-1]


def without(spans, held):
    """The rows of `spans` outside `held` (both ascending (start, count) lists) as spans."""
    held_rows = set()
    for s, n in held:
        held_rows.update(range(s, s + n))
    out = []
    for s, n in spans:
        for r in range(s, s + n):
            if r in held_rows:
                continue
            if out and out[-1][0] + out[-1][1] == r:
                out[-1] = (out[-1][0], out[-1][1] + 1)
            else:
                out.append((r, 1))
    return out


def client_probe(client, dataset, train, test, latents, context_length, pool):
    """The former client-side probe of the train and test spans (positives, negatives) and the
    latents given: test accuracy per k."""

    def examples(sides):
        xs = [pooled(rows_of_spans(client, dataset, spans), context_length, pool)
              .tocsc()[:, latents].toarray().astype(np.float64) for spans in sides]
        return np.vstack(xs), np.concatenate([np.ones(len(xs[0])), np.zeros(len(xs[1]))])

    x_train, y_train = examples(train)
    x_test, y_test = examples(test)
    mean, scale = x_train.mean(axis=0), x_train.std(axis=0)
    scale[scale == 0] = 1.0
    accuracy = []
    for k in KS:
        used = min(k, len(latents))
        w, b = fit_logistic((x_train[:, :used] - mean[:used]) / scale[:used], y_train, 1.0)
        raw_w = w / scale[:used]
        raw_b = b - float(raw_w @ mean[:used])
        accuracy.append(float(np.mean((x_test[:, :used] @ raw_w + raw_b > 0) == (y_test == 1))))
    return np.array(accuracy)


def spans_of_mask(mask, unit=1):
    rows = np.flatnonzero(mask)
    breaks = np.flatnonzero(np.diff(rows) != 1) + 1
    starts = rows[np.concatenate(([0], breaks))]
    ends = rows[np.concatenate((breaks - 1, [rows.size - 1]))] + 1
    return [(int(s) * unit, int(e - s) * unit) for s, e in zip(starts, ends)]


def main():
    parser = x1_sparse.arguments()
    parser.add_argument("--orientations", type=int, default=0,
                        help="seeds of the both-ways-round table (0: no table)")
    args = parser.parse_args()
    with x1_sparse.served(args.sequences, "probe-bench") as (client, dataset):
        whole, tokens = client.read_rows(dataset)
        # The label: the row holds one of the 8 tokens ranked 9th to 16th by frequency (a
        # made-up "concept" of several tokens, which no one latent marks exactly).
        by_frequency = np.argsort(-np.bincount(tokens), kind="stable")
        fires = np.isin(tokens, by_frequency[8:16])
        per_sequence = fires[:whole.shape[0] // 128 * 128].reshape(-1, 128).sum(axis=1)
        often = per_sequence > np.median(per_sequence)
        rarely = per_sequence < np.median(per_sequence)
        probes = {
            "rows": (spans_of_mask(fires), spans_of_mask(~fires), None),
            "documents": (spans_of_mask(often, 128), spans_of_mask(rarely, 128), "mean"),
        }
        print("dataset: %d rows, %d of them (%.1f%%) hold one of the tokens %s; %d + %d "
              "sequences above / below the median count" % (
                  whole.shape[0], fires.sum(), 100 * fires.mean(),
                  by_frequency[8:16].tolist(), often.sum(), rarely.sum()))
        print("probe      daemon s   client s   client/daemon   max |test acc diff|")
        for name, (positives, negatives, pool) in probes.items():
            times = {"daemon": [], "client": []}
            for _ in range(args.repeats):  # alternating, so drift hits both alike
                start = time.perf_counter()
                answer = client.sparse_probe(dataset, row_ranges=positives,
                                             versus_row_ranges=negatives, ks=KS, pool=pool,
                                             max_rows=1 << 24)
                times["daemon"].append(time.perf_counter() - start)
                # The daemon's split, outside the clock (the client drew its own).
                train = [without(positives, answer["test_row_ranges"]),
                         without(negatives, answer["test_versus_row_ranges"])]
                test = [answer["test_row_ranges"], answer["test_versus_row_ranges"]]
                start = time.perf_counter()
                accuracy = client_probe(client, dataset, train, test, answer["latents"], 128,
                                        pool)
                times["client"].append(time.perf_counter() - start)
            gap = float(np.max(np.abs(accuracy - answer["test_accuracy"])))
            best = {side: min(t) for side, t in times.items()}
            print("%-9s  %8.3f   %8.3f   x%-13.1f  %.4f" % (
                name, best["daemon"], best["client"], best["client"] / best["daemon"], gap))
            print("           all runs: daemon %s, client %s" % (
                " ".join("%.3f" % t for t in times["daemon"]),
                " ".join("%.3f" % t for t in times["client"])))
            print("           test accuracy per k %s: %s (latents %s)" % (
                list(KS), answer["test_accuracy"].round(4).tolist(),
                answer["latents"][:5].tolist()))
        if args.orientations > 0:
            orientation_table(client, dataset, probes, args.orientations)


def orientation_table(client, dataset, probes, seeds):
    """Each probe with its classes as given and swapped, per selection rule: the held-out
    balanced accuracy per k, averaged over `seeds` splits."""
    print("\nheld-out balanced accuracy per k %s, mean of %d seeds" % (list(KS), seeds))
    print("probe      select    classes    balanced accuracy")
    for name, (positives, negatives, pool) in probes.items():
        for select in ("fraction", "mean"):
            for swapped in (False, True):
                a, b = (negatives, positives) if swapped else (positives, negatives)
                scores = [client.sparse_probe(dataset, row_ranges=a, versus_row_ranges=b, ks=KS,
                                              pool=pool, select=select, seed=seed,
                                              max_rows=1 << 24)["test_balanced_accuracy"]
                          for seed in range(seeds)]
                print("%-9s  %-8s  %-9s  %s" % (
                    name, select, "swapped" if swapped else "as given",
                    " ".join("%.3f" % x for x in np.mean(scores, axis=0))))


if __name__ == "__main__":
    main()
