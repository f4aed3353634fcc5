#!/usr/bin/env bash
# Runs one Python end-to-end test file with Debian's interpreter (the python3 on PATH may not see
# python3-grpcio), the generated stubs and client/python on PYTHONPATH, and the built binaries.
set -euo pipefail
runfiles="${TEST_SRCDIR:-$PWD/..}/latentd"
export LATENTD="$runfiles/server/latentd"
export LATENTCTL="$runfiles/client/latentctl"
export PYTHONPATH="$runfiles/proto/py:$runfiles/client/python:$runfiles/tests/e2e${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
exec /usr/bin/python3 "$runfiles/$1" -v
