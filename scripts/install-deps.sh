#!/usr/bin/env bash
# Installs the Debian 12 packages latentd builds, runs and tests with. Idempotent: installs only what
# is missing, so a second run costs a few dpkg queries. Needs root (or sudo) when something is missing.
set -euo pipefail

PACKAGES=(
  bazel-bootstrap bazel-rules-java build-essential
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  librocksdb-dev libabsl-dev libtorch-dev libhdf5-dev nlohmann-json3-dev zlib1g-dev
  # ICU: the tokenizer's Unicode normalization and split regexes (latentctl tokenize).
  libicu-dev
  # Compression: Parquet token files' pages and .gz / .zst text (librocksdb-dev pulls them in
  # too; named here because common/parquet_column and client/text_input link them themselves).
  libsnappy-dev libzstd-dev liblz4-dev
  # scripts/fetch-tokenizers.sh: the tokenizer parity test's real tokenizer.json files.
  curl ca-certificates openssl
  # Debian's LibTorch links Gloo but ships no Gloo headers; c10d data parallel needs them.
  libgloo-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  # Without an optimized BLAS, Debian's LibTorch falls back to the reference BLAS (50x slower).
  libopenblas0-pthread
  python3 python3-grpcio python3-protobuf python3-numpy python3-scipy python3-h5py python3-torch
  python3-matplotlib
  # tests/e2e/test_metrics.py parses GET /metrics with the Prometheus project's own parser.
  python3-prometheus-client
)

missing=()
for p in "${PACKAGES[@]}"; do
  [[ "$p" == \#* ]] && continue
  status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "installed" ]] || missing+=("$p")
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
