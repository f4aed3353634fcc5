#!/usr/bin/env bash
# Downloads the Debian 12 packages that the GPU machine lacks into tests/gpu/debs/, to be carried
# there with the device tool (carry=["tests/gpu/debs"]); run.sh unpacks them with dpkg -x.
#
# Only abseil is needed: efcp and the engine sources use absl::Status / StrCat. The kit links the
# static archives of libabsl-dev (so the GPU machine's glibc need not be >= 2.34, which the shared
# libabsl20220623 requires); the runtime package is carried too for the shared fallback
# (KIT_ABSL_STATIC=0).
set -euo pipefail

kit="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dest="${kit}/debs"
# Same versions as the headers this repository builds against here, when installed.
packages=()
for p in libabsl-dev libabsl20220623; do
  v="$(dpkg-query -W -f='${Version}' "$p" 2>/dev/null || true)"
  if [[ -n "$v" ]]; then packages+=("$p=$v"); else packages+=("$p"); fi
done

mkdir -p "$dest"
rm -f "$dest"/*.deb
(cd "$dest" && apt-get download "${packages[@]}")
ls -l "$dest"
echo "total: $(du -cb "$dest"/*.deb | tail -1 | cut -f1) bytes ($(du -ch "$dest"/*.deb | tail -1 | cut -f1))"
