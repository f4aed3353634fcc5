"""One EXTRACT job through engine/extract_tool, timed, for the benchmarks that compare two ways of
running a model side by side (hf_native_bench.py, hf_dtype_bench.py)."""
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np


def run_dense(tool, root, model, hook, context, tag):
    """A DENSE float32 job of `model` (a ModelSpec as a dict) at `hook` over root/tokens.npy.
    Returns (wall seconds, the process's peak RSS in bytes, the stored rows); exits on failure."""
    work = tempfile.mkdtemp(dir=root, prefix=tag)
    spec = {"model": model, "hookName": hook, "mode": "DENSE", "valueDtype": "FLOAT32",
            "tokens": {"path": os.path.join(root, "tokens.npy"), "contextLength": context},
            "batchSequences": 8, "commitRows": 4096}
    with open(os.path.join(work, "spec.json"), "w") as f:
        json.dump(spec, f)
    out = os.path.join(work, "out")
    os.makedirs(out)
    start = time.perf_counter()
    p = subprocess.Popen([tool, "--spec=" + os.path.join(work, "spec.json"), "--data_root=" + root,
                          "--db=" + os.path.join(work, "db"), "--out=" + out],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - start
    if status != 0:
        sys.exit("%s failed: %s" % (tag, p.stderr.read()))
    return wall, usage.ru_maxrss * 1024, np.load(os.path.join(out, "dense.npy"))
