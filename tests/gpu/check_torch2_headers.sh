#!/usr/bin/env bash
# Compiles (syntax only) every engine/ and efcp/ source and the GPU kit's checks against the
# headers of a LibTorch 2.x, without a GPU machine: Debian 13's packages are downloaded (not
# installed) into a scratch directory and put ahead of Debian 12's LibTorch 1.13 headers.
#   tests/gpu/check_torch2_headers.sh          LibTorch 2.6 CPU headers (libtorch-dev, 2.4 MB);
#                                              code that needs CUDA headers is skipped
#   tests/gpu/check_torch2_headers.sh --cuda   LibTorch 2.6 CUDA headers (libtorch-cuda-dev) with
#                                              CUDA 12.4, libcu++ and NCCL headers (1.05 GB of
#                                              .debs): LATENTD_WITH_CUDA and USE_C10D_NCCL on
# Run after `bazel build //engine/... //efcp/...` (it needs the generated protobuf headers).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cuda=0
[[ "${1:-}" == "--cuda" ]] && cuda=1
scratch="${TORCH2_SCRATCH:-/tmp/latentd-torch2}"
if [[ $cuda == 1 ]]; then
  packages=(libtorch-cuda-dev nvidia-cuda-dev libcu++-dev libnccl-dev)
  root="$scratch/root-cuda"
  defines=(-DUSE_C10D_GLOO -DUSE_C10D_NCCL -DLATENTD_WITH_CUDA -DKIT_WITH_NCCL)
else
  packages=(libtorch-dev)
  root="$scratch/root"
  defines=(-DUSE_C10D_GLOO)
fi
mkdir -p "$scratch/etc/sources.list.d" "$scratch/lists/partial" "$scratch/cache/archives/partial" \
  "$scratch/debs"
cat > "$scratch/etc/sources.list.d/trixie.sources" <<'SRC'
Types: deb
URIs: http://deb.debian.org/debian
Suites: trixie
Components: main contrib non-free
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
apt_opts=(-o Dir::Etc::sourcelist=/dev/null -o "Dir::Etc::sourceparts=$scratch/etc/sources.list.d"
          -o "Dir::State::Lists=$scratch/lists" -o "Dir::Cache=$scratch/cache")
if [[ ! -f "$root/.complete" ]]; then
  apt-get "${apt_opts[@]}" update -qq
  rm -rf "$root" && mkdir -p "$root"
  for p in "${packages[@]}"; do
    (cd "$scratch/debs" && apt-get "${apt_opts[@]}" download "$p" 2>&1 |
      grep -v "^W: Download is performed unsandboxed" || true)
    dpkg -x "$(ls -t "$scratch/debs/${p}_"*.deb | head -1)" "$root"
  done
  touch "$root/.complete"
fi
inc="$root/usr/include"
echo "LibTorch headers: $(grep -A1 'define TORCH_VERSION ' "$inc/torch/csrc/api/include/torch/version.h" | tr -d '\\\n' | tr -s ' ')"

cd "$(cd "$repo" && bazel info execution_root 2>/dev/null)"
bin=bazel-out/k8-fastbuild/bin
failed=0
for f in "$repo"/engine/*.cc "$repo"/efcp/*.cc "$repo"/tests/gpu/*.cc; do
  case "$f" in *_test.cc) continue ;; esac
  if [[ $cuda == 0 && "$f" == */tests/gpu/* ]] && grep -q 'cuda_runtime_api.h\|c10/cuda/' "$f"; then
    echo "SKIP ${f#"$repo"/} (needs CUDA headers: --cuda)"
    continue
  fi
  if ! out=$(g++ -std=c++17 -fsyntax-only "${defines[@]}" -Wno-deprecated-declarations \
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
