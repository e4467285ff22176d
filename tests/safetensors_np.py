"""The safetensors format for the Python oracles and benchmarks, with numpy only (Debian has no
`safetensors` package): one writer for any dtype's raw bytes and an f32 reader.

    write_safetensors(path, [f32_entry("w", array), ("h", "BF16", shape, raw_bytes)])
    arrays = read_safetensors_f32(path)   # name -> float32 ndarray
    arrays = read_safetensors(path)       # name -> ndarray of the stored dtype (F32, F16, U8, BF16 widened)
"""
import json
import struct

import numpy as np


def f32_entry(name, array):
    """(name, "F32", shape, bytes) for write_safetensors."""
    a = np.ascontiguousarray(array, dtype=np.float32)
    return name, "F32", list(a.shape), a.tobytes()


def write_safetensors(path, entries, metadata=None):
    """entries: iterable of (name, dtype, shape, raw little-endian bytes); metadata: str -> str.
    As the C++ writer: the data starts on a 64-byte boundary and the entries of whole 64-byte
    lines come first, so each of them does too (no split cache lines in the kernels' loads);
    no holes."""
    entries = list(entries)
    entries = [e for e in entries if len(e[3]) % 64 == 0] + [e for e in entries if len(e[3]) % 64 != 0]
    header, blobs, off = {}, [], 0
    for name, dtype, shape, b in entries:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    if metadata is not None:
        header["__metadata__"] = metadata
    h = json.dumps(header).encode()
    h += b" " * ((64 - (8 + len(h)) % 64) % 64)  # the data starts 64-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def read_safetensors(path, dtypes=("F32", "F16", "BF16", "U8")):
    """name -> ndarray (a copy) for every tensor: F32, F16 and U8 as stored, BF16 widened to
    float32; a dtype not in dtypes is a ValueError."""
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in dtypes:
            raise ValueError(f"{path}: {name} is {info['dtype']}, expected {' or '.join(dtypes)}")
        a, b = info["data_offsets"]
        raw = data[8 + n + a:8 + n + b]
        if info["dtype"] == "BF16":
            arr = (np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            arr = np.frombuffer(raw, dtype={"F32": np.float32, "F16": np.float16, "U8": np.uint8}[info["dtype"]])
        out[name] = arr.reshape(info["shape"]).copy()
    return out


def read_safetensors_f32(path):
    """name -> float32 ndarray (a copy) for every tensor of an all-F32 file."""
    return read_safetensors(path, dtypes=("F32",))
