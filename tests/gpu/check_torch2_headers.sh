#!/usr/bin/env bash
# Compiles (syntax only) every engine/ and efcp/ source, and the GPU kit's non-CUDA checks,
# against the headers of a LibTorch 2.x, without a GPU machine: Debian 13's libtorch-dev (2.6) is
# downloaded (not installed) into a scratch directory and put ahead of Debian 12's 1.13 headers.
# What needs CUDA headers (LATENTD_WITH_CUDA, NCCL) is not covered; the kit covers it on a GPU.
#   tests/gpu/check_torch2_headers.sh        (after `bazel build //engine/... //efcp/...`)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
scratch="${TORCH2_SCRATCH:-/tmp/latentd-torch2}"
mkdir -p "$scratch/etc/sources.list.d" "$scratch/lists/partial" "$scratch/cache/archives/partial"
cat > "$scratch/etc/sources.list.d/trixie.sources" <<'SRC'
Types: deb
URIs: http://deb.debian.org/debian
Suites: trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
apt_opts=(-o Dir::Etc::sourcelist=/dev/null -o "Dir::Etc::sourceparts=$scratch/etc/sources.list.d"
          -o "Dir::State::Lists=$scratch/lists" -o "Dir::Cache=$scratch/cache")
if [[ ! -d "$scratch/root/usr/include/torch" ]]; then
  apt-get "${apt_opts[@]}" update -qq
  (cd "$scratch" && apt-get "${apt_opts[@]}" download libtorch-dev 2>&1 | grep -v "^W: Download is performed unsandboxed" || true)
  dpkg -x "$scratch"/libtorch-dev_*.deb "$scratch/root"
fi
inc="$scratch/root/usr/include"
echo "LibTorch headers: $(grep -m1 'define TORCH_VERSION ' "$inc/torch/csrc/api/include/torch/version.h" || echo '?')"

cd "$(cd "$repo" && bazel info execution_root 2>/dev/null)"
bin=bazel-out/k8-fastbuild/bin
failed=0
for f in "$repo"/engine/*.cc "$repo"/efcp/*.cc "$repo"/tests/gpu/*.cc; do
  case "$f" in *_test.cc) continue ;; esac
  if grep -q 'cuda_runtime_api.h\|c10/cuda/' "$f" && [[ "$f" == */tests/gpu/* ]]; then
    echo "SKIP $(basename "$f") (needs CUDA headers)"
    continue
  fi
  if ! out=$(g++ -std=c++17 -fsyntax-only -DUSE_C10D_GLOO -Wno-deprecated-declarations \
      -iquote "$repo" -iquote "$bin" -I "$bin/proto" -I "$repo" \
      -isystem "$inc" -isystem "$inc/torch/csrc/api/include" "$f" 2>&1); then
    echo "FAIL ${f#"$repo"/}"
    echo "$out" | grep -m5 error
    failed=$((failed + 1))
  else
    echo "ok   ${f#"$repo"/}"
  fi
done
echo "$failed file(s) failed"
[[ $failed -eq 0 ]]
