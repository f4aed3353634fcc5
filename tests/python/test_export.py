"""Exports written by the store load with scipy and h5py and equal the store's own rows."""
import json
import os
import subprocess
import sys
import tempfile
import unittest
import zipfile

import h5py
import numpy as np
import scipy.sparse

HELPER = os.environ.get("EXPORT_HELPER", "tests/storage_export_helper")


class ExportTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        subprocess.run([HELPER, cls.dir], check=True)
        with open(os.path.join(cls.dir, "expected.json")) as f:
            cls.expected = json.load(f)
        e = cls.expected["sparse"]
        cls.csr = scipy.sparse.csr_matrix(
            (np.array(e["values"], dtype=np.float32), np.array(e["indices"]), np.array(e["indptr"])),
            shape=tuple(e["shape"]))
        cls.tokens = np.array(e["token_ids"], dtype=np.int32)

    def path(self, name):
        return os.path.join(self.dir, name)

    def check_csr(self, m, start, stop):
        want = self.csr[start:stop]
        self.assertEqual(m.shape, want.shape)
        np.testing.assert_array_equal(m.indptr, want.indptr)
        np.testing.assert_array_equal(m.indices, want.indices)
        np.testing.assert_array_equal(m.data.astype(np.float32), want.data)

    def read_safetensors(self, path):
        """{name: numpy array} of a safetensors file, read by the format's definition: an
        8-byte little-endian header length, the JSON header, then the tensors' bytes."""
        dtypes = {"U16": np.uint16, "U32": np.uint32, "F16": np.float16, "F32": np.float32,
                  "I32": np.int32}
        with open(path, "rb") as f:
            blob = f.read()
        n = int.from_bytes(blob[:8], "little")
        header = json.loads(blob[8:8 + n])
        self.assertEqual(header["__metadata__"]["written_by"], "latentd")
        out = {}
        for name, t in header.items():
            if name == "__metadata__":
                continue
            begin, end = t["data_offsets"]
            out[name] = np.frombuffer(blob[8 + n + begin:8 + n + end],
                                      dtype=dtypes[t["dtype"]]).reshape(t["shape"])
        return out

    def load_delphi(self, latents_dir, hook):
        """What delphi's LatentDataset makes of a cache: every (location, activation) with the
        latent offset by the file's first latent, and the tokens of the first file."""
        module = os.path.join(latents_dir, hook)
        files = sorted((f for f in os.listdir(module) if f.endswith(".safetensors")),
                       key=lambda f: int(f.split("_")[0]))
        locations, activations, tokens, edges = [], [], None, []
        for name in files:
            first, last = (int(x) for x in name[:-len(".safetensors")].split("_"))
            edges.append((first, last))
            data = self.read_safetensors(os.path.join(module, name))
            loc = data["locations"].astype(np.int64)
            self.assertTrue(np.all(loc[:, 2] <= last - first))
            loc[:, 2] += first
            locations.append(loc)
            activations.append(data["activations"])
            if tokens is None:
                tokens = data["tokens"].astype(np.int64)
            else:
                np.testing.assert_array_equal(data["tokens"], tokens)
        with open(os.path.join(module, "config.json")) as f:
            config = json.load(f)
        return np.concatenate(locations), np.concatenate(activations), tokens, edges, config

    def test_delphi_latent_cache_holds_the_stores_rows(self):
        for name, splits, (start, stop) in (("latents", 3, (0, 500)), ("part", 5, (100, 400))):
            locations, activations, tokens, edges, config = self.load_delphi(
                self.path(name), "blocks.2.hook_resid_post")
            self.assertEqual(len(edges), splits)
            self.assertEqual(edges[0][0], 0)
            self.assertEqual(edges[-1][1], 299)  # d_sae 300
            for (_, last), (first, _) in zip(edges, edges[1:]):
                self.assertEqual(first, last + 1)
            self.assertEqual(locations.dtype, np.int64)
            self.assertEqual(activations.dtype, np.float16)
            # Rebuilt as a CSR matrix of the range's rows: the store's rows, value for value.
            rows = locations[:, 0] * 50 + locations[:, 1]
            m = scipy.sparse.csr_matrix((activations.astype(np.float32),
                                         (rows, locations[:, 2])), shape=(stop - start, 300))
            want = self.csr[start:stop]
            self.assertEqual(m.nnz, want.nnz)
            self.assertEqual((m != want).nnz, 0)
            self.assertEqual(tokens.shape, ((stop - start) // 50, 50))
            np.testing.assert_array_equal(tokens.reshape(-1), self.tokens[start:stop])
            self.assertEqual(config["model_name"], "ref-gpt2")
            self.assertEqual(config["ctx_len"], 50)
            self.assertEqual(config["n_tokens"], stop - start)
            self.assertEqual(config["n_splits"], splits)
            self.assertEqual(config["latentd"]["row_start"], start)
        # Nothing but the module's directory is left in the latents directory.
        self.assertEqual(os.listdir(self.path("part")), ["blocks.2.hook_resid_post"])

    def test_npz_loads_with_scipy(self):
        # sparse_blocks.npz was written a few rows at a time with every size in ZIP64 fields.
        for name in ("sparse_full.npz", "sparse_blocks.npz"):
            m = scipy.sparse.load_npz(self.path(name))
            self.assertEqual(m.format, "csr")
            self.assertEqual(m.dtype, np.float16)  # the dataset's dtype
            self.check_csr(m, 0, 500)
            with np.load(self.path(name)) as z:
                np.testing.assert_array_equal(z["token_ids"], self.tokens)
                self.assertEqual(int(z["row_start"]), 0)
        with zipfile.ZipFile(self.path("sparse_blocks.npz")) as z:
            self.assertIsNone(z.testzip())  # every member's CRC
            self.assertEqual(sorted(i.filename for i in z.infolist()),
                             ["data.npy", "format.npy", "indices.npy", "indptr.npy",
                              "row_start.npy", "shape.npy", "token_ids.npy"])

    def test_npz_partial_range(self):
        m = scipy.sparse.load_npz(self.path("sparse_part.npz"))
        self.check_csr(m, 120, 340)
        with np.load(self.path("sparse_part.npz")) as z:
            np.testing.assert_array_equal(z["token_ids"], self.tokens[120:340])
            self.assertEqual(int(z["row_start"]), 120)

    def test_hdf5_csr_group(self):
        for name, (start, stop) in (("sparse_full.h5", (0, 500)), ("sparse_part.h5", (120, 340)),
                                    ("sparse_part_blocks.h5", (120, 340))):
            with h5py.File(self.path(name), "r") as f:
                self.assertEqual(f["data"].dtype, np.float16)
                shape = tuple(int(x) for x in f.attrs["shape"])
                m = scipy.sparse.csr_matrix(
                    (f["data"][()], f["indices"][()], f["indptr"][()]), shape=shape)
                self.check_csr(m, start, stop)
                np.testing.assert_array_equal(f["token_ids"][()], self.tokens[start:stop])
                self.assertEqual(f.attrs["format"].decode(), "csr")
                self.assertEqual(f.attrs["hook_name"].decode(), self.expected["meta"]["hook_name"])
                self.assertEqual(f.attrs["model_id"].decode(), self.expected["meta"]["model_id"])
                self.assertEqual(int(f.attrs["k"]), self.expected["meta"]["k"])
                self.assertEqual(int(f.attrs["row_start"]), start)

    def test_dense_exports(self):
        d = self.expected["dense"]
        want = np.array(d["values"], dtype=np.float32).reshape(d["shape"])
        for name in ("dense.npz", "dense_blocks.npz"):
            with np.load(self.path(name)) as z:
                np.testing.assert_array_equal(z["data"], want)
                np.testing.assert_array_equal(z["token_ids"], d["token_ids"])
        for name in ("dense_part.h5", "dense_part_blocks.h5"):
            with h5py.File(self.path(name), "r") as f:
                np.testing.assert_array_equal(f["data"][()], want[5:35])
                np.testing.assert_array_equal(f["token_ids"][()], d["token_ids"][5:35])
                self.assertEqual(f.attrs["format"].decode(), "dense")
                self.assertEqual(tuple(int(x) for x in f.attrs["shape"]), (30, 8))


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
