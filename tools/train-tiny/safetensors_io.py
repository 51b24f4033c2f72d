"""Reads and writes safetensors files with the standard library and numpy (Debian may not package
the safetensors module): an 8-byte little-endian header length, a JSON header of each tensor's
dtype, shape and data_offsets, then the tensors' raw little-endian bytes."""
import json
import os
import struct

import numpy as np


def write_safetensors(path, entries):
    """entries: list of (name, dtype string, shape, bytes), written in that order; the file is
    replaced whole (written beside it, then renamed). Returns the bytes of tensor data."""
    header = {"__metadata__": {"format": "pt"}}
    off = 0
    for name, dtype, shape, data in entries:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(data)]}
        off += len(data)
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * ((8 - len(hj) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for _, _, _, data in entries:
            f.write(data)
    os.replace(tmp, path)
    return off


def read_safetensors(path):
    """[(name, dtype string, shape, raw uint8 array mapped from the file)], in file order."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    base = 8 + n
    out = []
    for name, h in header.items():
        if name == "__metadata__":
            continue
        b, e = h["data_offsets"]
        out.append((b, name, h["dtype"], h["shape"], mm[base + b: base + e]))
    out.sort(key=lambda t: t[0])
    return [t[1:] for t in out]
