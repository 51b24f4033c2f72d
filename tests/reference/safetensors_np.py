"""Read and write safetensors files with NumPy only (no torch, no safetensors package).

Format: an 8-byte little-endian header length N, N bytes of JSON mapping each tensor name to
{"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the first byte after the
header; an optional "__metadata__" entry), then the raw little-endian data.

A Hugging Face model directory holds either one model.safetensors or shards listed by
model.safetensors.index.json ({"weight_map": {tensor name: shard file}}).
"""

import json
import os

import numpy as np

# safetensors dtype name -> NumPy storage dtype. BF16 is stored as uint16 and widened on read.
_STORAGE = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}


class SafetensorsError(Exception):
    """A safetensors file or model directory is malformed or incomplete."""


def bf16_to_f32(raw):
    """uint16 bit patterns of bf16 values -> float32 (exact: bf16 is the top half of f32)."""
    return (raw.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x):
    """float32 -> uint16 bf16 bit patterns, round to nearest even (finite inputs)."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounding = ((bits >> 16) & 1) + np.uint32(0x7FFF)
    return ((bits + rounding) >> 16).astype(np.uint16)


def read_header(path):
    """Returns (tensor entries dict, byte offset of the data section) of one file."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise SafetensorsError(f"{path}: shorter than the 8-byte header length")
        n = int.from_bytes(head, "little")
        size = os.path.getsize(path)
        if n > size - 8:
            raise SafetensorsError(f"{path}: header length {n} exceeds file size {size}")
        header = json.loads(f.read(n).decode("utf-8"))
    header.pop("__metadata__", None)
    data_start = 8 + n
    for name, entry in header.items():
        dtype = entry["dtype"]
        if dtype not in _STORAGE:
            raise SafetensorsError(f"{path}: tensor {name} has unsupported dtype {dtype}")
        begin, end = entry["data_offsets"]
        want = int(np.prod(entry["shape"], dtype=np.int64)) * _STORAGE[dtype].itemsize
        if end - begin != want or data_start + end > size:
            raise SafetensorsError(
                f"{path}: tensor {name} dtype {dtype} shape {entry['shape']} spans "
                f"[{begin}, {end}) but needs {want} bytes within a {size}-byte file")
    return header, data_start


class TensorStore:
    """The tensors of a Hugging Face model directory, read lazily through memory maps."""

    def __init__(self, model_dir):
        self.model_dir = model_dir
        self._entries = {}  # name -> (path, entry, data_start)
        index_path = os.path.join(model_dir, "model.safetensors.index.json")
        single_path = os.path.join(model_dir, "model.safetensors")
        if os.path.exists(index_path):
            with open(index_path) as f:
                weight_map = json.load(f)["weight_map"]
            files = sorted(set(weight_map.values()))
        elif os.path.exists(single_path):
            weight_map = None
            files = ["model.safetensors"]
        else:
            raise SafetensorsError(f"{model_dir}: no model.safetensors nor model.safetensors.index.json")
        for file in files:
            path = os.path.join(model_dir, file)
            header, data_start = read_header(path)
            for name, entry in header.items():
                if name in self._entries:
                    raise SafetensorsError(f"{model_dir}: tensor {name} appears in two shards")
                if weight_map is not None and weight_map.get(name) != file:
                    raise SafetensorsError(
                        f"{model_dir}: tensor {name} is in {file} but the index says {weight_map.get(name)}")
                self._entries[name] = (path, entry, data_start)
        if weight_map is not None:
            missing = sorted(set(weight_map) - set(self._entries))
            if missing:
                raise SafetensorsError(f"{model_dir}: index lists tensors absent from the shards: {missing[:5]}")
        self._maps = {}

    def names(self):
        return sorted(self._entries)

    def __contains__(self, name):
        return name in self._entries

    def dtype(self, name):
        return self._entries[name][1]["dtype"]

    def get(self, name, dtype=np.float64):
        """The tensor as a fresh array of `dtype` (bf16/f16 widened exactly)."""
        if name not in self._entries:
            raise KeyError(f"tensor {name} not found in {self.model_dir}")
        path, entry, data_start = self._entries[name]
        if path not in self._maps:
            self._maps[path] = np.memmap(path, dtype=np.uint8, mode="r")
        begin, end = entry["data_offsets"]
        raw = self._maps[path][data_start + begin:data_start + end]
        arr = raw.view(_STORAGE[entry["dtype"]]).reshape(entry["shape"])
        if entry["dtype"] == "BF16":
            arr = bf16_to_f32(arr)
        return np.array(arr, dtype=dtype)


def write_file(path, tensors, dtype="F32"):
    """Writes {name: float array} to one safetensors file, every tensor stored as `dtype`."""
    header = {}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        x = np.asarray(tensors[name])
        if dtype == "BF16":
            data = f32_to_bf16(x.astype(np.float32)).tobytes()
        else:
            data = np.ascontiguousarray(x, dtype=_STORAGE[dtype]).tobytes()
        header[name] = {"dtype": dtype, "shape": list(x.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * ((8 - len(raw) % 8) % 8)  # keep the data section 8-byte aligned
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for blob in blobs:
            f.write(blob)


def write_model_dir(model_dir, tensors, dtype="F32", n_shards=1):
    """Writes tensors as model.safetensors, or as n_shards shards plus the index file."""
    os.makedirs(model_dir, exist_ok=True)
    if n_shards == 1:
        write_file(os.path.join(model_dir, "model.safetensors"), tensors, dtype)
        return
    names = sorted(tensors)
    weight_map = {}
    for s in range(n_shards):
        file = f"model-{s + 1:05d}-of-{n_shards:05d}.safetensors"
        part = {name: tensors[name] for name in names[s::n_shards]}
        write_file(os.path.join(model_dir, file), part, dtype)
        weight_map.update({name: file for name in part})
    with open(os.path.join(model_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=1)
