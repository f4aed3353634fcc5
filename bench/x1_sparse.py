"""The SPARSE dataset several benches read: the X1 reference transformer (d 256, 4 layers,
vocabulary 4096, context 128; docs/EXTRACT.md) over make_demo_inputs.py's Zipf tokens, hook
blocks.2.hook_resid_post, encoded by its TopK SAE (k = 32, d_sae 4096), stored fp16; or, DENSE,
the hook's hidden states themselves."""

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile

from harness import Daemon
from latentd.v1 import jobs_pb2

HERE = os.path.dirname(os.path.abspath(__file__))


def arguments():
    """The options of every bench over this dataset: --sequences (of 128 tokens, to extract)
    and --repeats (of each timed way); a bench adds its own before parse_args()."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--sequences", type=int, default=1024,
                        help="128-token sequences to extract")
    parser.add_argument("--repeats", type=int, default=3)
    return parser


def make_inputs(directory, sequences):
    """Writes tokens.npy (`sequences` x 128 ids), the SAE and a vocabulary into `directory`."""
    subprocess.run([sys.executable, os.path.join(HERE, "..", "scripts", "make_demo_inputs.py"),
                    directory, "--sequences", str(sequences)], check=True,
                   stdout=subprocess.DEVNULL)


def extract(client, inputs, name, mode="SPARSE"):
    """EXTRACTs the dataset from make_inputs' `inputs` through `client` (mode "DENSE": the
    hook's fp16 hidden states instead of the SAE's latents); its id."""
    spec = {
        "model": {"reference": {"dModel": 256, "nLayers": 4, "nHeads": 4, "dMlp": 1024,
                                "vocabSize": 4096, "contextLength": 128, "seed": 0}},
        "hookName": "blocks.2.hook_resid_post",
        "tokens": {"path": os.path.join(inputs, "tokens.npy"), "contextLength": 128},
        "mode": mode, "datasetName": name}
    if mode == "SPARSE":
        spec["sae"] = {"path": os.path.join(inputs, "sae")}
    job = client.wait(client.submit("EXTRACT", spec).id)
    if job.state != jobs_pb2.SUCCEEDED:
        raise RuntimeError("EXTRACT failed: " + job.message)
    return job.result.extract.dataset_id


@contextlib.contextmanager
def served(sequences, name, mode="SPARSE"):
    """A latentd on loopback (one CPU device) serving the dataset (extract's `mode`), made in a
    temporary directory: yields (client, dataset id), and stops the daemon after."""
    with tempfile.TemporaryDirectory() as tmp:
        inputs = os.path.join(tmp, "inputs")
        make_inputs(inputs, sequences)
        daemon = Daemon(os.path.join(tmp, "d"), devices="cpu:1").start()
        try:
            client = daemon.client(timeout=600)
            yield client, extract(client, inputs, name, mode)
        finally:
            daemon.stop()
