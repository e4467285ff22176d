#!/usr/bin/env python3
"""HDF5 import oracle: files written with h5py exactly the way the reference's save_h5 writes
them (a group per key, gzip-compressed 1-D datasets data_0..data_N, attribute num_tensors;
int64 token tensors as from torch.long, numpy bool masks, float32 rewards) must come out of
`astrai preprocess --format hdf5` with the same values, record boundaries and dtypes, read
back here with numpy straight from the .bin/.idx files."""
import json
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np

ASTRAI = os.environ["ASTRAI_BIN"]


def save_h5(path, groups):
    # Mirrors the reference's save_h5 (layout only).
    with h5py.File(path, "w") as f:
        for key, tensors in groups.items():
            grp = f.create_group(key)
            grp.attrs["num_tensors"] = len(tensors)
            for idx, arr in enumerate(tensors):
                grp.create_dataset(f"data_{idx}", data=arr, compression="gzip", compression_opts=4)


def read_key(out, meta, key):
    info = meta["keys"][key]
    dtype = {"I32": "<i4", "U8": "u1", "U16": "<u2", "F32": "<f4", "I64": "<i8"}[info["dtype"]]
    data = np.fromfile(os.path.join(out, info["file"]), dtype=dtype)
    offsets = np.fromfile(os.path.join(out, info["index"]), dtype="<i8")
    assert len(data) == info["length"], (key, len(data), info["length"])
    return [data[offsets[i]:offsets[i + 1]] for i in range(len(offsets) - 1)], info


def main():
    rng = np.random.default_rng(1234)
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        # Two files (pretraining + SFT keys) with random lengths, including an empty tensor.
        files = []
        expected = {"sequence": [], "loss_mask": [], "rewards": []}
        for part in range(2):
            n = 15 if part == 0 else 4
            seqs = [rng.integers(0, 151000, size=int(rng.integers(0, 300)), dtype=np.int64) for _ in range(n)]
            seqs[3] = np.zeros(0, dtype=np.int64)
            masks = [rng.integers(0, 2, size=len(s)).astype(bool) for s in seqs]
            rewards = [rng.standard_normal(int(rng.integers(1, 4))).astype(np.float32) for _ in range(3)]
            path = os.path.join(tmp, f"part{part}.h5")
            save_h5(path, {"sequence": seqs, "loss_mask": masks, "rewards": rewards})
            files.append(path)
            expected["sequence"] += seqs
            expected["loss_mask"] += masks
            expected["rewards"] += rewards
        out = os.path.join(tmp, "ds")
        r = subprocess.run([ASTRAI, "preprocess", "--format", "hdf5", "--input", *files, "--output", out, "--quiet"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            print("astrai preprocess failed:", r.stderr)
            return 1
        meta = json.load(open(os.path.join(out, "meta.json")))
        for key, want_dtype in (("sequence", "I32"), ("loss_mask", "U8"), ("rewards", "F32")):
            got, info = read_key(out, meta, key)
            if info["dtype"] != want_dtype:
                failures.append(f"{key}: dtype {info['dtype']}, expected {want_dtype}")
            if len(got) != len(expected[key]):
                failures.append(f"{key}: {len(got)} records, expected {len(expected[key])}")
                continue
            for i, (g, e) in enumerate(zip(got, expected[key])):
                if not np.array_equal(g, e.astype(g.dtype)):
                    failures.append(f"{key} record {i} differs")
                    break
        if meta["keys"]["sequence"].get("token_ids") is not True:
            failures.append("sequence is not marked as token ids")
        if ["sequence", "loss_mask"] not in meta["groups"]:
            failures.append(f"sequence/loss_mask not grouped: {meta['groups']}")

        # A preference file (chosen/rejected + masks), natural order beyond data_9.
        pref = {k: [] for k in ("chosen", "rejected", "chosen_mask", "rejected_mask")}
        for i in range(12):
            c = rng.integers(0, 1000, size=5 + i, dtype=np.int64)
            rj = rng.integers(0, 1000, size=3 + i, dtype=np.int64)
            pref["chosen"].append(c)
            pref["rejected"].append(rj)
            pref["chosen_mask"].append(np.arange(len(c)) >= 2)
            pref["rejected_mask"].append(np.arange(len(rj)) >= 2)
        path = os.path.join(tmp, "pref.h5")
        save_h5(path, pref)
        out2 = os.path.join(tmp, "pref")
        r = subprocess.run([ASTRAI, "preprocess", "--format", "hdf5", "--input", path, "--output", out2, "--quiet"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            failures.append("preference import failed: " + r.stderr)
        else:
            meta2 = json.load(open(os.path.join(out2, "meta.json")))
            for key, tensors in pref.items():
                got, _ = read_key(out2, meta2, key)
                if len(got) != len(tensors) or any(not np.array_equal(g, t.astype(g.dtype)) for g, t in zip(got, tensors)):
                    failures.append(f"preference key {key} differs (record order?)")

        # A 2-D dataset is rejected with a clear message, and nothing is written.
        bad = os.path.join(tmp, "bad.h5")
        with h5py.File(bad, "w") as f:
            f.create_group("sequence").create_dataset("data_0", data=np.zeros((2, 3), dtype=np.int64))
        out3 = os.path.join(tmp, "bad")
        r = subprocess.run([ASTRAI, "preprocess", "--format", "hdf5", "--input", bad, "--output", out3, "--quiet"],
                           capture_output=True, text=True)
        if r.returncode == 0 or "1-D" not in r.stderr or os.path.exists(out3):
            failures.append(f"2-D dataset: rc={r.returncode} stderr={r.stderr!r}")

    for f in failures:
        print("FAIL:", f)
    print("hdf5 oracle:", "FAILED" if failures else "ok")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
