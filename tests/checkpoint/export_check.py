#!/usr/bin/env python3
"""The Python side of the consolidated export and the import (checkpoint.safetensors_py).

    export_check.py check  WORK    after `export_tool save WORK`
    export_check.py write  WORK    writes WORK/python_weights.safetensors for `export_tool import`
    export_check.py verify WORK    after `export_tool import`: the re-export holds those weights

check: every rank file of WORK/ckpt/step_00000003 opens with Python's safetensors; each tensor
of each field is assembled here, independently of trident's code, from index.json's shapes,
split axes, parts and pieces (part q holds the q-th of `parts` slices of the extent padded to a
multiple of parts, along the split axis), and must equal export_master.safetensors (field
"master", F32) and export_parameters.safetensors (field "parameters", BF16 compared by bits)
exactly; every element of every tensor must come from exactly one piece.

write / verify: weights in F32 and F16 (PyTorch's usual dtypes) with an extra tensor the model
does not have; the model started from them, saved and exported again by trident, must hold
the same values (F16 widened to F32 exactly).
Exits 1 naming every mismatch.
"""
import json
import sys
from pathlib import Path

import numpy as np
from safetensors import deserialize, safe_open
from safetensors.numpy import load_file, save_file

errors = []


def fail(msg):
    errors.append(msg)
    print("MISMATCH:", msg)


def raw_tensors(path):
    """name -> (dtype, shape, raw bytes), through safetensors' own parser (bf16 included)."""
    out = {}
    for name, t in deserialize(Path(path).read_bytes()):
        out[name] = (t["dtype"], tuple(t["shape"]), bytes(t["data"]))
    return out


def as_array(dtype, shape, data):
    if dtype == "F32":
        return np.frombuffer(data, dtype="<f4").reshape(shape)
    if dtype == "BF16":  # by its bits
        return np.frombuffer(data, dtype="<u2").reshape(shape)
    raise ValueError(f"unexpected dtype {dtype}")


def check(work):
    ckpt = work / "ckpt" / "step_00000003"
    index = json.loads((ckpt / "index.json").read_text())
    files = {f: raw_tensors(ckpt / f) for f in index["files"]}
    for f in index["files"]:  # the high-level reader too, with its metadata
        with safe_open(ckpt / f, framework="numpy") as h:
            meta = h.metadata()
            if meta.get("format") != "trident-zero-checkpoint":
                fail(f"{f}: metadata format {meta.get('format')!r}")
            for key in h.keys():
                if not key.startswith("parameters/"):  # F32 fields: numpy reads them
                    h.get_tensor(key)
    exports = {"master": raw_tensors(work / "export_master.safetensors"),
               "parameters": raw_tensors(work / "export_parameters.safetensors")}
    checked = 0
    for field, export in exports.items():
        if set(export) != set(index["tensors"]):
            fail(f"{field}: export has {sorted(export)}, index {sorted(index['tensors'])}")
        for name, t in index["tensors"].items():
            shape, axis, parts = t["shape"], t["split_axis"], t["parts"]
            extent = shape[axis] if axis is not None else int(np.prod(shape))
            part_extent = -(-extent // parts)
            local_shape = list(shape)
            if axis is not None:
                local_shape[axis] = part_extent
            local_numel = int(np.prod(local_shape)) if axis is not None else extent
            dtype = index["fields"][field]
            np_dtype = "<f4" if dtype == "float32" else "<u2"
            locals_ = {q: np.zeros(local_numel, dtype=np_dtype) for q in range(parts)}
            seen = {q: np.zeros(local_numel, dtype=np.int32) for q in range(parts)}
            for p in t["pieces"]:
                key = f"{field}/{name}@{p['begin']}"
                dt, shp, data = files[p["file"]][key]
                a = as_array(dt, shp, data)
                if a.size != p["count"]:
                    fail(f"{key} in {p['file']}: {a.size} elements, index says {p['count']}")
                    continue
                locals_[p["part"]][p["begin"]:p["begin"] + p["count"]] = a
                seen[p["part"]][p["begin"]:p["begin"] + p["count"]] += 1
            for q in range(parts):
                if not np.all(seen[q] == 1):
                    fail(f"{field}/{name} part {q}: elements covered {sorted(set(seen[q].tolist()))} times")
            whole = np.zeros(shape, dtype=np_dtype)
            for q in range(parts):
                if axis is None:
                    whole = locals_[q].reshape(shape)
                    continue
                lo, hi = min(extent, q * part_extent), min(extent, (q + 1) * part_extent)
                local = locals_[q].reshape(local_shape)
                src = [slice(None)] * len(shape)
                dst = [slice(None)] * len(shape)
                src[axis] = slice(0, hi - lo)
                dst[axis] = slice(lo, hi)
                whole[tuple(dst)] = local[tuple(src)]
            dt, shp, data = export[name]
            got = as_array(dt, shp, data)
            if list(shp) != shape:
                fail(f"{field}/{name}: export shape {shp}, index {shape}")
            elif not np.array_equal(got.view(np.uint32 if np_dtype == "<f4" else np.uint16),
                                    whole.view(np.uint32 if np_dtype == "<f4" else np.uint16)):
                fail(f"{field}/{name}: the export differs from the pieces assembled in Python")
            checked += 1
    print(f"export: {checked} tensors of 2 fields equal their pieces, assembled in Python")
    # The split tensors really are split, so the assembly above was exercised.
    if not any(t["parts"] > 1 and t["split_axis"] == 1 for t in index["tensors"].values()):
        fail("no tensor is split along axis 1")


def weights():
    rng = np.random.default_rng(7)
    return {"embed": rng.standard_normal((37, 8)).astype(np.float32),
            "w1": rng.standard_normal((8, 24)).astype(np.float16),
            "b1": rng.standard_normal(24).astype(np.float32),
            "w2": rng.standard_normal((24, 8)).astype(np.float16),
            "ln": rng.standard_normal(8).astype(np.float32),
            "extra.buffer": np.arange(5, dtype=np.float32)}


def write(work):
    save_file(weights(), work / "python_weights.safetensors", metadata={"format": "pt"})
    print("wrote python_weights.safetensors")


def verify(work):
    got = load_file(work / "reexport.safetensors")
    want = weights()
    del want["extra.buffer"]
    if set(got) != set(want):
        fail(f"re-export has {sorted(got)}, expected {sorted(want)}")
    for name, w in want.items():
        g = got.get(name)
        if g is None:
            continue
        if g.dtype != np.float32 or g.shape != w.shape or not np.array_equal(g, w.astype(np.float32)):
            fail(f"{name}: imported and re-exported {g.dtype}{g.shape} differs from what Python wrote ({w.dtype}{w.shape})")
    print(f"import: {len(want)} tensors written by Python came back equal")


if __name__ == "__main__":
    mode, work = sys.argv[1], Path(sys.argv[2])
    {"check": check, "write": write, "verify": verify}[mode](work)
    if errors:
        print(f"{len(errors)} mismatches")
        sys.exit(1)
