"""Exports written by the store load with scipy and h5py and equal the store's own rows."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

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

    def test_npz_loads_with_scipy(self):
        m = scipy.sparse.load_npz(self.path("sparse_full.npz"))
        self.assertEqual(m.format, "csr")
        self.assertEqual(m.dtype, np.float16)  # the dataset's dtype
        self.check_csr(m, 0, 500)
        with np.load(self.path("sparse_full.npz")) as z:
            np.testing.assert_array_equal(z["token_ids"], self.tokens)
            self.assertEqual(int(z["row_start"]), 0)

    def test_npz_partial_range(self):
        m = scipy.sparse.load_npz(self.path("sparse_part.npz"))
        self.check_csr(m, 120, 340)
        with np.load(self.path("sparse_part.npz")) as z:
            np.testing.assert_array_equal(z["token_ids"], self.tokens[120:340])
            self.assertEqual(int(z["row_start"]), 120)

    def test_hdf5_csr_group(self):
        for name, (start, stop) in (("sparse_full.h5", (0, 500)), ("sparse_part.h5", (120, 340))):
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
        with np.load(self.path("dense.npz")) as z:
            np.testing.assert_array_equal(z["data"], want)
            np.testing.assert_array_equal(z["token_ids"], d["token_ids"])
        with h5py.File(self.path("dense_part.h5"), "r") as f:
            np.testing.assert_array_equal(f["data"][()], want[5:35])
            np.testing.assert_array_equal(f["token_ids"][()], d["token_ids"][5:35])
            self.assertEqual(f.attrs["format"].decode(), "dense")


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
