"""What the EXTRACT parity tests share: writing safetensors files by hand (Debian 12 has no
python3-safetensors) and Hugging Face checkpoint directories, running engine/extract_tool on a
spec, and comparing the DENSE rows it stored."""
import json
import os
import struct
import subprocess
import tempfile

import numpy as np
import torch


def write_safetensors(path, tensors):
    """`tensors` (name -> torch.Tensor) as float32, in the order given: an 8-byte little-endian
    header length, the JSON header padded with spaces to 8 bytes, the raw tensors."""
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        b = t.detach().to(torch.float32).contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def write_topk_sae(directory, d_in, d_sae, k, seed, bias=0.0):
    """A TopK SAE in the SAELens layout (sae_weights.safetensors + cfg.json) under `directory`:
    unit decoder rows, the encoder their transpose, biases of scale `bias`. Returns its weights."""
    g = torch.Generator().manual_seed(seed)
    w_dec = torch.randn(d_sae, d_in, generator=g)
    w_dec = w_dec / w_dec.norm(dim=1, keepdim=True)
    w = {"W_enc": w_dec.t().clone(), "b_enc": torch.randn(d_sae, generator=g) * bias,
         "W_dec": w_dec, "b_dec": torch.randn(d_in, generator=g) * bias}
    os.makedirs(directory, exist_ok=True)
    write_safetensors(os.path.join(directory, "sae_weights.safetensors"), w)
    with open(os.path.join(directory, "cfg.json"), "w") as f:
        json.dump({"d_in": d_in, "d_sae": d_sae, "architecture": "topk", "k": k}, f)
    return w


def topk_reconstruct(w, k):
    """x -> the reconstruction SAELens' TopK SAE of weights `w` gives: the k largest
    pre-activations, ReLU'd, decoded."""
    def reconstruct(x):
        pre = (x - w["b_dec"]) @ w["W_enc"] + w["b_enc"]
        top = pre.topk(k, dim=-1)
        z = torch.zeros_like(pre).scatter(-1, top.indices, top.values.relu())
        return z @ w["W_dec"] + w["b_dec"]
    return reconstruct


def run_extract_tool(tool, data_root, spec, devices=1):
    """Runs `spec` (an ExtractSpec as a dict) through extract_tool into a fresh store under
    `data_root`; returns the finished process and the directory its .npy files went to."""
    work = tempfile.mkdtemp(dir=data_root)
    with open(os.path.join(work, "spec.json"), "w") as f:
        json.dump(spec, f)
    out = os.path.join(work, "out")
    os.makedirs(out)
    p = subprocess.run([tool, "--spec=" + os.path.join(work, "spec.json"), "--data_root=" + data_root,
                        "--db=" + os.path.join(work, "db"), "--out=" + out, "--devices=%d" % devices],
                       capture_output=True, text=True, timeout=300)
    return p, out


def write_hf_checkpoint(directory, config, tensors):
    """A Hugging Face checkpoint as the Hub serves one: config.json and model.safetensors."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f)
    write_safetensors(os.path.join(directory, "model.safetensors"), tensors)


def assert_dense_rows(test, p, out, ids, want, what):
    """extract_tool (`p`, its output dir `out`) succeeded and stored `ids` and the float32 rows
    `want` (rows x width) within 1e-5 of their largest value."""
    test.assertEqual(p.returncode, 0, p.stderr)
    np.testing.assert_array_equal(np.load(os.path.join(out, "token_ids.npy")), ids)
    got = np.load(os.path.join(out, "dense.npy"))
    test.assertEqual(got.shape, want.shape)
    err = np.abs(got - want).max() / np.abs(want).max()
    test.assertLess(err, 1e-5, "%s: max error %.3g of the largest value" % (what, err))


def assert_stored_latents(test, out, want):
    """extract_tool's CSR rows in `out` (indptr/indices/values.npy), made dense, equal the dense
    latents `want` (rows x d_sae) within 1e-4 (a random latent at its threshold may flip; none of
    the tests' sits that close), and more than one latent fires a row on average."""
    indptr, indices = np.load(os.path.join(out, "indptr.npy")), np.load(os.path.join(out, "indices.npy"))
    values = np.load(os.path.join(out, "values.npy"))
    got = np.zeros_like(want)
    for r in range(len(want)):
        got[r, indices[indptr[r]:indptr[r + 1]]] = values[indptr[r]:indptr[r + 1]]
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
    test.assertGreater((want != 0).sum(), len(want))
