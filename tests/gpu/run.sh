#!/usr/bin/env bash
# GPU check kit: configure, build and run every check in one go, from the repository root:
#
#   tests/gpu/run.sh
#
# On a lent GPU machine it builds against the LibTorch inside the PyTorch wheel of `python3`, with
# abseil unpacked from the carried tests/gpu/debs/*.deb (tests/gpu/fetch_debs.sh), CUDA headers and
# cudart from nvcc's toolkit or the nvidia-* wheels, and NCCL from the nvidia-nccl wheel. On a
# machine without CUDA (Debian 12 with python3-torch) the same script builds against Debian's
# LibTorch 1.13 and runs the CPU halves; CUDA checks print SKIP.
#
# The report goes to $OUT/gpu_check.txt (the device tool returns what is written under $OUT),
# line by line as checks finish, so a run cut short still reports what it reached; configure.log,
# build.log and one <check>.log per binary go next to it. Exit status 1 when anything FAILed.
#
# Environment (all optional): OUT, KIT_WORK_DIR (build + unpacked debs; default
# /tmp/latentd-gpu-kit), KIT_JOBS (default nproc), KIT_BUDGET_S (whole run, default 470),
# KIT_CHECK_TIMEOUT_S (per binary, default 150), KIT_PYTHON, KIT_FORCE_MANUAL=1 (skip
# find_package(Torch)), KIT_TORCH_INCLUDE_DIR / KIT_TORCH_LIBRARY_DIR (manual mode layout),
# KIT_ABSL_STATIC (default 1).
set -uo pipefail

kit="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
work="${KIT_WORK_DIR:-/tmp/latentd-gpu-kit}"
out="${OUT:-$work/out}"
build="$work/build"
prefix="$work/prefix"
jobs="${KIT_JOBS:-$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)}"
budget="${KIT_BUDGET_S:-470}"
check_timeout="${KIT_CHECK_TIMEOUT_S:-150}"
start="$(date +%s)"
mkdir -p "$out" "$work"
report="$out/gpu_check.txt"
: >"$report"

say() { echo "$*" | tee -a "$report"; }
elapsed() { echo $(($(date +%s) - start)); }
# Seconds left of the budget for the next step (at least 5, so a late step still says why).
left() {
  local l=$((budget - $(elapsed)))
  ((l < 5)) && l=5
  echo "$l"
}
# First match of a file glob under the nvidia-* wheels, or nothing.
wheel_find() { [[ -d "$SITE/nvidia" ]] && find "$SITE/nvidia" "$@" 2>/dev/null | sort | head -1; }
# The first of the given paths that exists, or nothing.
first_file() {
  local f
  for f in "$@"; do [[ -e "$f" ]] && echo "$f" && return; done
}

say "== latentd GPU check kit, $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(uname -srm), $(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc) cores"
say "commit $(git -C "$kit" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$kit" diff --quiet HEAD -- . 2>/dev/null || echo ' (kit modified)')"
if command -v nvidia-smi >/dev/null; then
  say "nvidia-smi: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | paste -sd';')"
fi
if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
say "tools: $(cmake --version 2>/dev/null | head -1); ninja $(ninja --version 2>/dev/null || echo none); $(c++ --version 2>/dev/null | head -1); $(ldd --version 2>/dev/null | head -1); nvcc $(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*' || echo none)"

# ---- LibTorch, as the Python side sees it ---------------------------------------------------------
# The first interpreter whose torch is a CUDA build, else the first that imports torch at all (a
# GPU machine may also carry Debian's CPU-only python3-torch).
py=""
cpu_py=""
for cand in ${KIT_PYTHON:-} python3 /usr/local/bin/python3 /usr/bin/python3; do
  command -v "$cand" >/dev/null || continue
  "$cand" -c 'import sys, torch; sys.exit(0 if torch.version.cuda else 3)' >/dev/null 2>&1
  case $? in
    0) py="$cand" && break ;;
    3) [[ -z "$cpu_py" ]] && cpu_py="$cand" ;;
  esac
done
[[ -z "$py" ]] && py="$cpu_py"
if [[ -z "$py" ]]; then
  say "FAIL setup no python3 that imports torch (set KIT_PYTHON)"
  say "RESULT: FAIL after $(elapsed) s"
  exit 1
fi
TORCH_VERSION="?" TORCH_DIR="" SITE="" TORCH_CUDA="" CUDA_AVAILABLE=0 DEVICE_COUNT=0
NCCL_AVAILABLE=0 NCCL_VERSION="" CXX11_ABI=1
eval "$("$py" - <<'EOF'
import os, shlex, torch
def out(k, f):
    try:
        print(f"{k}={shlex.quote(str(f()))}")
    except Exception as e:  # one missing fact must not lose the others
        print(f"echo {shlex.quote(f'python: {k}: {e}')} >&2")
d = os.path.dirname(torch.__file__)
cuda = torch.cuda.is_available()
nccl = cuda and torch.distributed.is_available() and torch.distributed.is_nccl_available()
out("TORCH_VERSION", lambda: torch.__version__)
out("TORCH_DIR", lambda: d)
out("SITE", lambda: os.path.dirname(d))
out("TORCH_CUDA", lambda: torch.version.cuda or "")
out("CUDA_AVAILABLE", lambda: int(cuda))
out("DEVICE_COUNT", lambda: torch.cuda.device_count() if cuda else 0)
out("NCCL_AVAILABLE", lambda: int(nccl))
out("NCCL_VERSION", lambda: ".".join(map(str, torch.cuda.nccl.version())) if nccl else "")
out("CXX11_ABI", lambda: int(torch.compiled_with_cxx11_abi()))
EOF
)"
say "torch $TORCH_VERSION at $TORCH_DIR ($py): built for CUDA ${TORCH_CUDA:-none}, CUDA available $CUDA_AVAILABLE, devices $DEVICE_COUNT, NCCL ${NCCL_VERSION:-none}, cxx11 ABI $CXX11_ABI"

# ---- abseil from the carried .debs --------------------------------------------------------------
unpack() {
  if command -v dpkg >/dev/null; then
    dpkg -x "$1" "$2"
  else  # not a Debian-family machine: a .deb is an ar archive holding data.tar.*
    local tmp
    tmp="$(mktemp -d)"
    (cd "$tmp" && ar x "$1") && tar -xf "$tmp"/data.tar.* -C "$2"
    rm -rf "$tmp"
  fi
}
absl_prefix=""
shopt -s nullglob
debs=("$kit"/debs/*.deb)
shopt -u nullglob
if ((${#debs[@]} > 0)); then
  rm -rf "$prefix"
  mkdir -p "$prefix/absl"
  for deb in "${debs[@]}"; do unpack "$deb" "$prefix/absl"; done
  absl_prefix="$prefix/absl/usr"
  say "abseil: ${#debs[@]} .deb unpacked into $absl_prefix"
else
  say "abseil: no tests/gpu/debs/*.deb, using the system's"
fi

# ---- CUDA, NCCL and cuDNN locations ---------------------------------------------------------------
cuda_inc="" cudart="" nccl_inc="" nccl_lib="" extra_inc="" cudnn_inc="" cudnn_lib=""
if [[ -n "$TORCH_CUDA" ]]; then
  cuda_home="${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")}"
  for d in "$cuda_home/include" "$cuda_home/targets/x86_64-linux/include" /usr/local/cuda/include; do
    [[ -f "$d/cuda_runtime_api.h" ]] && cuda_inc="$d" && break
  done
  if [[ -z "$cuda_inc" ]]; then
    h="$(wheel_find -name cuda_runtime_api.h)"
    [[ -n "$h" ]] && cuda_inc="$(dirname "$h")"
  fi
  # The wheel's cudart first: it is the one libtorch_cuda.so loads through its RPATH.
  cudart="$(wheel_find -name 'libcudart.so*' -type f)"
  [[ -z "$cudart" ]] && cudart="$(first_file "$cuda_home"/{lib64,lib,targets/x86_64-linux/lib}/libcudart.so)"
  h="$(wheel_find -name nccl.h)"
  [[ -z "$h" ]] && h="$(first_file "$cuda_home/include/nccl.h" /usr/include/nccl.h)"
  [[ -n "$h" ]] && nccl_inc="$(dirname "$h")"
  nccl_lib="$(wheel_find -name 'libnccl.so*' -type f)"
  [[ -z "$nccl_lib" ]] && nccl_lib="$(first_file "$cuda_home"/{lib64,lib}/libnccl.so{,.2} /usr/lib/x86_64-linux-gnu/libnccl.so{,.2})"
  if [[ -d "$SITE/nvidia" ]]; then
    extra_inc="$(find "$SITE/nvidia" -maxdepth 3 -type d -name include 2>/dev/null | sort | paste -sd';')"
  fi
  h="$(wheel_find -name cudnn.h)"
  [[ -z "$h" ]] && h="$(first_file "$cuda_home/include/cudnn.h")"
  [[ -n "$h" ]] && cudnn_inc="$(dirname "$h")"
  cudnn_lib="$(wheel_find -name 'libcudnn.so*' -type f)"
  [[ -z "$cudnn_lib" ]] && cudnn_lib="$(first_file "$cuda_home"/{lib64,lib}/libcudnn.so)"
  say "cuda: headers ${cuda_inc:-NOT FOUND}; cudart ${cudart:-NOT FOUND}; nccl.h ${nccl_inc:-NOT FOUND}; libnccl ${nccl_lib:-NOT FOUND}; cudnn ${cudnn_inc:-none}"
fi
with_nccl=OFF
((NCCL_AVAILABLE == 1)) && [[ -n "$nccl_inc" ]] && with_nccl=ON

# ---- configure -----------------------------------------------------------------------------------
gen="Unix Makefiles"
command -v ninja >/dev/null && gen=Ninja
common=(-G "$gen" -DCMAKE_BUILD_TYPE=Release "-DKIT_CXX11_ABI=$CXX11_ABI"
  "-DABSL_PREFIX=$absl_prefix" "-DKIT_ABSL_STATIC=${KIT_ABSL_STATIC:-1}"
  "-DKIT_CUDA_INCLUDE_DIR=$cuda_inc" "-DKIT_CUDART_LIBRARY=$cudart"
  "-DKIT_EXTRA_INCLUDE_DIRS=$extra_inc" "-DKIT_WITH_NCCL=$with_nccl"
  "-DNCCL_INCLUDE_DIR=$nccl_inc" "-DNCCL_LIBRARY=$nccl_lib")
# Hints for the wheel's TorchConfig, whose CUDA part looks for cuDNN and the CUDA toolkit.
find_args=()
[[ -f "$TORCH_DIR/share/cmake/Torch/TorchConfig.cmake" ]] && find_args+=("-DTorch_DIR=$TORCH_DIR/share/cmake/Torch")
[[ -n "$cudnn_inc" ]] && find_args+=("-DCUDNN_INCLUDE_DIR=$cudnn_inc" "-DCUDNN_INCLUDE_PATH=$cudnn_inc")
[[ -n "$cudnn_lib" ]] && find_args+=("-DCUDNN_LIBRARY=$cudnn_lib" "-DCUDNN_LIBRARY_PATH=$cudnn_lib")
manual_args=(-DKIT_TORCH_MANUAL=ON "-DKIT_TORCH_ROOT=$TORCH_DIR"
  "-DKIT_TORCH_INCLUDE_DIR=${KIT_TORCH_INCLUDE_DIR:-}" "-DKIT_TORCH_LIBRARY_DIR=${KIT_TORCH_LIBRARY_DIR:-}")

t0="$(date +%s)"
configured=""
: >"$out/configure.log"
if [[ "${KIT_FORCE_MANUAL:-0}" != 1 ]]; then
  rm -rf "$build"
  echo "## find_package(Torch)" >>"$out/configure.log"
  if timeout "$(left)" cmake -S "$kit" -B "$build" "${common[@]}" "${find_args[@]}" >>"$out/configure.log" 2>&1; then
    configured="find_package(Torch)"
  else
    say "INFO configure find_package(Torch) failed ($(grep -m1 -A2 'CMake Error' "$out/configure.log" | tr '\n' ' ' | cut -c1-300)); retrying without it"
  fi
fi
if [[ -z "$configured" ]]; then
  rm -rf "$build"
  echo "## manual LibTorch" >>"$out/configure.log"
  if timeout "$(left)" cmake -S "$kit" -B "$build" "${common[@]}" "${manual_args[@]}" >>"$out/configure.log" 2>&1; then
    configured="LibTorch linked directly from $TORCH_DIR"
  fi
fi
if [[ -z "$configured" ]]; then
  say "FAIL configure $(grep -m1 -A3 'CMake Error' "$out/configure.log" | tr '\n' ' ' | cut -c1-400) (configure.log)"
  say "RESULT: FAIL after $(elapsed) s"
  exit 1
fi
say "configured with $configured, $gen, NCCL checks $with_nccl, in $(($(date +%s) - t0)) s: $(grep -E '^-- kit: (CUDA|NCCL)' "$out/configure.log" | sed 's/^-- kit: //' | paste -sd';')"

# ---- build ---------------------------------------------------------------------------------------
t0="$(date +%s)"
if [[ "$gen" == Ninja ]]; then
  timeout "$(left)" cmake --build "$build" -- -k 0 -j "$jobs" >"$out/build.log" 2>&1
else
  timeout "$(left)" cmake --build "$build" -- -k -j "$jobs" >"$out/build.log" 2>&1
fi
build_rc=$?
say "build: rc $build_rc in $(($(date +%s) - t0)) s with $jobs jobs (build.log)"
runnable=()
while read -r name state reason; do
  [[ -z "$name" ]] && continue
  if [[ "$state" != built ]]; then
    say "SKIP build.$name ${reason:-not configured}"
  elif [[ -x "$build/$name" ]]; then
    runnable+=("$name")
  else
    first="$(awk -v t="CMakeFiles/$name.dir" 'index($0, "FAILED: ") == 1 && index($0, t) { f = 1; next }
                  f && /error/ { print; exit }' "$out/build.log")"
    [[ -z "$first" ]] && first="$(grep -m1 -E 'error|FAILED' "$out/build.log")"
    say "FAIL build.$name did not build: $(echo "$first" | cut -c1-400)"
  fi
done <"$build/kit_targets.txt"

# ---- run -----------------------------------------------------------------------------------------
export KIT_EXPECT_CUDA="$CUDA_AVAILABLE"
export KIT_EXPECT_NCCL=$((CUDA_AVAILABLE == 1 && NCCL_AVAILABLE == 1 ? 1 : 0))
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
for name in cuda_check device_info_check engine_fence_check engine_cuda_info_check nccl_check engine_dp_check engine_fit_check engine_native_model_check; do
  [[ " ${runnable[*]} " == *" $name "* ]] || continue
  t="$(left)"
  ((t > check_timeout)) && t="$check_timeout"
  t0="$(date +%s)"
  timeout "$t" "$build/$name" >"$out/$name.log" 2>&1
  rc=$?
  grep -E '^(PASS|FAIL|SKIP|INFO) ' "$out/$name.log" >>"$report"
  grep -E '^(PASS|FAIL|SKIP|INFO) ' "$out/$name.log"
  if ((rc != 0)) && ! grep -q '^FAIL ' "$out/$name.log"; then
    why="exited with status $rc"
    ((rc == 124)) && why="timed out after $t s"
    say "FAIL $name $why; last output: $(grep -vE '^(PASS|SKIP|INFO) ' "$out/$name.log" | tail -3 | tr '\n' ' ' | cut -c1-400)"
  fi
  say "INFO $name.time $(($(date +%s) - t0)) s"
done

pass=$(grep -c '^PASS ' "$report")
fail=$(grep -c '^FAIL ' "$report")
skip=$(grep -c '^SKIP ' "$report")
if ((fail > 0)); then
  say "RESULT: FAIL ($pass pass, $fail fail, $skip skip) in $(elapsed) s"
  exit 1
fi
say "RESULT: PASS ($pass pass, $fail fail, $skip skip) in $(elapsed) s"
