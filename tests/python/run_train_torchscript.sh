#!/bin/sh
# Runs the TorchScript TRAIN test with Debian's python3-torch against engine/train_tool.
set -e
TRAIN_TOOL="$PWD/engine/train_tool" exec /usr/bin/python3 tests/python/test_train_torchscript.py
