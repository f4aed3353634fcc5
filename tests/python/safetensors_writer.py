"""Writes the safetensors format by hand (Debian 12 has no python3-safetensors): an 8-byte
little-endian header length, the JSON header padded with spaces to 8 bytes, the raw tensors."""
import json
import struct

import torch


def write_safetensors(path, tensors):
    """`tensors` (name -> torch.Tensor) as float32, in the order given."""
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
