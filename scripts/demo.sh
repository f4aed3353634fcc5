#!/usr/bin/env bash
# Starts latentd on its embedded default (127.0.0.1:50051, data under ~/.local/share/latentd) and
# runs a short demo against it: a PROBE of every device, then the loop users run on the reference
# transformer (DENSE hidden states -> an SAE trained with sparse M-FAC -> SPARSE latents of two
# hooks in one pass), queried back. latentd keeps running afterwards; stop it with `kill $(cat /tmp/latentd.pid)`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
bazel build //server:latentd //client:latentctl //proto:api_py
bin=$(bazel info bazel-bin 2>/dev/null)
LATENTD=$bin/server/latentd
export LATENTCTL=$bin/client/latentctl

if ! $LATENTCTL devices >/dev/null 2>&1; then
  echo "demo: starting latentd (log: /tmp/latentd.log)"
  nohup "$LATENTD" >/tmp/latentd.log 2>&1 &
  echo $! > /tmp/latentd.pid
  for _ in $(seq 1 100); do
    $LATENTCTL devices >/dev/null 2>&1 && break
    sleep 0.1
  done
fi
$LATENTCTL devices

echo
echo "demo: PROBE job (device self-test)"
job=$($LATENTCTL submit --type=PROBE --label=demo-probe)
$LATENTCTL watch "$job"
$LATENTCTL get "$job"

if [[ -x scripts/demo-extract.sh ]]; then
  scripts/demo-extract.sh
fi
echo
echo "demo: latentd is still running (pid $(cat /tmp/latentd.pid 2>/dev/null || echo '?')); try: bazel-bin/client/latentctl list"
