#!/usr/bin/env bash
# Runs tests/python/test_extract_parity.py with Debian's python3 (python3-torch) against the built
# engine/extract_tool.
set -euo pipefail
runfiles="${TEST_SRCDIR:-$PWD/..}/latentd"
export EXTRACT_TOOL="$runfiles/engine/extract_tool"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
exec /usr/bin/python3 "$runfiles/tests/python/test_extract_parity.py" -v
