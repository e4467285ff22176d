"""The safetensors format for the Python oracles and benchmarks, with numpy only (Debian has no
`safetensors` package): one writer for any dtype's raw bytes and an f32 reader.

    write_safetensors(path, [f32_entry("w", array), ("h", "BF16", shape, raw_bytes)])
    arrays = read_safetensors_f32(path)   # name -> float32 ndarray
"""
import json
import struct

import numpy as np


def f32_entry(name, array):
    """(name, "F32", shape, bytes) for write_safetensors."""
    a = np.ascontiguousarray(array, dtype=np.float32)
    return name, "F32", list(a.shape), a.tobytes()


def write_safetensors(path, entries, metadata=None):
    """entries: iterable of (name, dtype, shape, raw little-endian bytes); metadata: str -> str."""
    header, blobs, off = {}, [], 0
    for name, dtype, shape, b in entries:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    if metadata is not None:
        header["__metadata__"] = metadata
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def read_safetensors_f32(path):
    """name -> float32 ndarray (a copy) for every tensor of an all-F32 file."""
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] != "F32":
            raise ValueError(f"{path}: {name} is {info['dtype']}, expected F32")
        a, b = info["data_offsets"]
        out[name] = np.frombuffer(data[8 + n + a:8 + n + b], dtype=np.float32).reshape(info["shape"]).copy()
    return out
