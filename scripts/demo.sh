#!/usr/bin/env bash
# Starts latentd on its embedded default (127.0.0.1:50051, data under ~/.local/share/latentd) and
# runs a short demo against it: a PROBE of every device, then the loop users run on the reference
# transformer (DENSE hidden states -> an SAE trained with sparse M-FAC -> SPARSE latents of two
# hooks in one pass), queried back; then model diffing (two models' activations -> a crosscoder ->
# its latents, each model's own tested by latent scaling). latentd keeps running afterwards; stop
# it with `kill $(cat /tmp/latentd.pid)`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
bazel build //server:latentd //client:latentctl //proto:api_py
bin=$(bazel info bazel-bin 2>/dev/null)
LATENTD=$bin/server/latentd
export LATENTCTL=$bin/client/latentctl

if ! $LATENTCTL devices >/dev/null 2>&1; then
  echo "demo: starting latentd (log: /tmp/latentd.log)"
  rm -f /tmp/latentd.metrics_port
  # Prometheus text on a free port (GET /metrics; docs/SERVICE.md), shown at the end.
  nohup "$LATENTD" --metrics_listen=127.0.0.1:0 --metrics_port_file=/tmp/latentd.metrics_port \
    >/tmp/latentd.log 2>&1 &
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
if [[ -x scripts/demo-diff.sh ]]; then
  scripts/demo-diff.sh
fi
if [[ -s /tmp/latentd.metrics_port ]]; then
  metrics="http://127.0.0.1:$(cat /tmp/latentd.metrics_port)/metrics"
  echo
  echo "demo: what a Prometheus scrape of $metrics says of the jobs (deploy/grafana has a dashboard)"
  /usr/bin/python3 -c 'import sys, urllib.request
for line in urllib.request.urlopen(sys.argv[1], timeout=10).read().decode().splitlines():
    if line.startswith("latentd_jobs{") and not line.endswith(" 0"):
        print(" ", line)' "$metrics"
fi
echo
echo "demo: latentd is still running (pid $(cat /tmp/latentd.pid 2>/dev/null || echo '?')); try: bazel-bin/client/latentctl list"
