"""ReadRows into Python: a whole SPARSE dataset as a scipy CSR matrix through the Python client,
three ways side by side in one run against one latentd on loopback:

  lists    the client before packed pieces: repeated fields appended to Python lists, then numpy;
  repeated read_rows(packed=False): repeated fields through numpy.fromiter;
  packed   read_rows() (the default): PackedCsr byte strings through numpy.frombuffer.

Then one latent's firings through latent_firings (ReadLatentFirings, latent-major) against
taking its column from the whole matrix.

The dataset is a real EXTRACT of the X1 reference transformer (docs/EXTRACT.md) with a TopK SAE
(k = 32, d_sae = 4096, fp16), so its values and latents are what users read.

    bazel build //server:latentd //client:latentctl //proto:api_py
    PYTHONPATH=bazel-bin/proto/py:client/python:tests/e2e /usr/bin/python3 \\
        bench/read_rows_bench.py [--sequences 1024] [--repeats 3]
"""

import time

import numpy as np
import scipy.sparse

import x1_sparse
from latentd.v1 import datasets_pb2



def read_lists(client, dataset_id):
    """The pre-packed client's reader, kept here as the baseline."""
    request = datasets_pb2.ReadRowsRequest(dataset_id=dataset_id)
    data, indices, indptr, tokens = [], [], [0], []
    cols = 0
    for piece in client.datasets.ReadRows(request, metadata=client.metadata):
        base = indptr[-1]
        data.extend(piece.values)
        indices.extend(piece.indices)
        indptr.extend(base + p for p in piece.indptr[1:])
        tokens.extend(piece.token_ids)
        cols = piece.num_cols
    matrix = scipy.sparse.csr_matrix(
        (np.asarray(data, np.float32), np.asarray(indices, np.int32),
         np.asarray(indptr, np.int64)), shape=(len(indptr) - 1, cols))
    return matrix, np.asarray(tokens, np.int32)


def wire_bytes(client, dataset_id, packed):
    request = datasets_pb2.ReadRowsRequest(dataset_id=dataset_id, packed=packed)
    return sum(p.ByteSize() for p in client.datasets.ReadRows(request, metadata=client.metadata))


def main():
    args = x1_sparse.arguments().parse_args()
    with x1_sparse.served(args.sequences, "read-bench") as (client, dataset):
        readers = {
            "lists": lambda: read_lists(client, dataset),
            "repeated": lambda: client.read_rows(dataset, packed=False),
            "packed": lambda: client.read_rows(dataset),
        }
        reference, reference_tokens = readers["lists"]()
        times = {name: [] for name in readers}
        for _ in range(args.repeats):  # alternating, so drift hits every reader alike
            for name, read in readers.items():
                start = time.perf_counter()
                matrix, tokens = read()
                times[name].append(time.perf_counter() - start)
                if (matrix != reference).nnz or not (tokens == reference_tokens).all():
                    raise RuntimeError(name + " read different rows")
        rows, nnz = reference.shape[0], reference.nnz
        print("dataset: %d rows, %d entries (k = 32, d_sae = 4096, fp16)" % (rows, nnz))
        print("reader     best s   rows/s      entries/s   wire B/entry   vs lists")
        best_lists = min(times["lists"])
        for name in readers:
            best = min(times[name])
            wire = wire_bytes(client, dataset, name == "packed") / nnz
            print("%-9s  %6.3f   %9.0f   %9.2fM   %8.2f      x%.1f" % (
                name, best, rows / best, nnz / best / 1e6, wire, best_lists / best))
            print("           all runs: " + " ".join("%.3f" % t for t in times[name]))
        # One latent's firings: latent-major through ReadLatentFirings against the column
        # of the whole matrix read packed (what a user without it does), same latents.
        columns = reference.tocsc()
        counts = np.diff(columns.indptr)
        latents = np.argsort(-counts, kind="stable")[np.linspace(0, 4095, 20).astype(int)]
        per_latent = []
        for j in latents:
            start = time.perf_counter()
            rows_j, values_j = client.latent_firings(dataset, int(j))
            per_latent.append(time.perf_counter() - start)
            column = columns[:, int(j)].tocoo()
            order = np.argsort(column.row)
            if rows_j.tolist() != column.row[order].tolist() or \
                    not (values_j == column.data[order]).all():
                raise RuntimeError("latent %d: firings differ from the rows' column" % j)
        per_latent.sort()
        print("latent_firings of 20 latents spread over the frequency ranks (%d to %d "
              "firings): p50 %.2f ms, max %.2f ms; the whole matrix packed: %.3f s (x%.0f)" % (
                  counts[latents].min(), counts[latents].max(), per_latent[10] * 1e3,
                  per_latent[-1] * 1e3, min(times["packed"]),
                  min(times["packed"]) / per_latent[10]))


if __name__ == "__main__":
    main()
