#!/usr/bin/env bash
# Runs one Python test file under Bazel with Debian's interpreter (the python3 on PATH may not see
# python3-grpcio, -torch, -scipy, -h5py), the generated stubs and client/python on PYTHONPATH, and
# the built binaries it needs in the environment:
#
#   run_python_test.sh [NAME=path/in/runfiles ...] tests/path/to/test.py
#
# Each NAME=path becomes an environment variable holding the absolute runfiles path.
set -euo pipefail
runfiles="${TEST_SRCDIR:-$PWD/..}/latentd"
export PYTHONPATH="$runfiles/proto/py:$runfiles/client/python:$runfiles/tests/e2e${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
while [[ $# -gt 1 ]]; do
  export "${1%%=*}=$runfiles/${1#*=}"
  shift
done
cd "$runfiles"
exec /usr/bin/python3 "$runfiles/$1" -v
