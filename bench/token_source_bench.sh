#!/usr/bin/env bash
# Parquet token reading against .npy (bench/token_source_bench.cc). Needs node and, under
# NODE_PATH, parquet-wasm@0.6.1 and apache-arrow@17 (npm install them anywhere).
#
#   NODE_PATH=/tmp/pq/node_modules bench/token_source_bench.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/latentd-token-bench}
mkdir -p "$out"
node bench/make_parquet_tokens.cjs "$out"
bazel build //bench:token_source_bench >/dev/null 2>&1
bazel-bin/bench/token_source_bench parquet="$out/tokens.parquet" npy="$out/tokens.npy"
