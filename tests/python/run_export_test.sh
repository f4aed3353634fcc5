#!/bin/sh
# Runs the export test with Debian's python (scipy, h5py), against the helper from runfiles.
set -e
EXPORT_HELPER="$PWD/tests/storage_export_helper" exec /usr/bin/python3 tests/python/test_export.py
