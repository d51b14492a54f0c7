#!/usr/bin/env python3
"""The Python side of checkpoint.safetensors_py: trident's files through Python's safetensors.

    safetensors_check.py DIR

DIR holds what `safetensors_tool write DIR` wrote. Checks, with the safetensors package (its
Rust parser validates every file it opens, with the rules trident's reader copies):
  1. trident_dtypes.safetensors (all ten dtypes, a scalar, empty tensors, metadata, U8 first so
     the rest is unaligned): safe_open(framework="numpy") gives every tensor numpy has, value
     for value, and the metadata; safetensors.deserialize gives every tensor's raw bytes,
     bfloat16 included, compared with the bytes numpy makes for the expected values.
  2. trident_reference_order.safetensors (numpy's dtypes in the reference's order): load_file
     reads it, and safetensors.numpy.save of the same arrays makes exactly the same bytes.
  3. writes python_written.safetensors (F32, F16, I32 and metadata) with save_file, which
     `safetensors_tool check` then reads back value by value (the import direction).
Exits 1 naming every mismatch.

bfloat16 without torch: numpy has no bfloat16, so safe_open(framework="numpy").get_tensor and
load_file cannot return one. safetensors.deserialize(bytes) runs the same Rust parser and hands
back each tensor's dtype, shape and raw bytes; the expected bf16 bytes are the top halves of
the float32 values (exact: every value is representable in bf16), taken with numpy as uint16.
"""
import json
import struct
import sys
from pathlib import Path

import numpy as np
import safetensors
from safetensors import deserialize, safe_open
from safetensors.numpy import load_file, save, save_file


def bf16_bits(values):
    """bfloat16 as uint16 bits: the upper half of the float32 (exact for these values)."""
    return (np.asarray(values, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)


# Element i (flat, row-major) of each tensor; safetensors_tool.cpp (struct expected) repeats these.
def expected():
    i = lambda n: np.arange(n, dtype=np.int64)  # noqa: E731
    return {
        "f32": (((i(6) - 2.5) * 0.5).astype(np.float32).reshape(2, 3), "F32"),
        "f64": (((i(3) + 1) / 3.0).astype(np.float64), "F64"),
        "f16": (((i(4) - 1) * 0.25).astype(np.float16), "F16"),
        "bf16": (bf16_bits((i(4) - 1.5) * 2.0).reshape(2, 2), "BF16"),  # bits, see above
        "i8": ((i(5) * 37 - 100).astype(np.int8), "I8"),
        "u8": ((255 - i(5) * 50).astype(np.uint8), "U8"),
        "i32": ((i(4) * -123456789 + 7).astype(np.int32), "I32"),
        "u32": (np.array([4294967295 - k * 1000000007 for k in range(4)], dtype=np.uint32).reshape(2, 2), "U32"),
        "i64": (np.array([-(1 << 62) + k * 205891132094649 for k in range(3)], dtype=np.int64), "I64"),
        "u64": (np.array([(1 << 64) - 1 - k * (1 << 40) for k in range(3)], dtype=np.uint64).reshape(3, 1), "U64"),
        "scalar": (np.array(3.5, dtype=np.float32), "F32"),
        "empty_i32": (np.zeros((0,), dtype=np.int32), "I32"),
        "empty_f16": (np.zeros((2, 0), dtype=np.float16), "F16"),
    }


problems = []


def expect(ok, what):
    if not ok:
        problems.append(what)
        print("MISMATCH:", what, file=sys.stderr)


def header_of(path):
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    return raw, n, json.loads(raw[8 : 8 + n])


def check_dtypes(path):
    before = len(problems)
    exp = expected()
    raw, n, header = header_of(path)
    expect(n % 8 == 0, f"{path.name}: header length {n} is not a multiple of 8")
    order = [k for k in header if k != "__metadata__"]
    expect(order[0] == "u8", f"{path.name}: not in the order added (u8 first): {order}")

    with safe_open(str(path), framework="numpy") as f:
        metadata = f.metadata()
        expect(metadata == {"format": "trident", "unicode": "\u00e9\u2211"}, f"{path.name}: metadata {metadata}")
        expect(sorted(f.keys()) == sorted(exp), f"{path.name}: tensor names {sorted(f.keys())}")
        for name, (value, dtype) in exp.items():
            got_dtype = f.get_slice(name).get_dtype()
            expect(got_dtype == dtype, f"{name}: dtype {got_dtype}, expected {dtype}")
            if dtype == "BF16":
                continue  # numpy has no bfloat16: checked through deserialize below
            got = f.get_tensor(name)
            expect(got.dtype == value.dtype and got.shape == value.shape,
                   f"{name}: {got.dtype}{got.shape}, expected {value.dtype}{value.shape}")
            expect(np.array_equal(got, value), f"{name}: values {got.ravel()[:8]}, expected {value.ravel()[:8]}")

    for name, info in deserialize(raw):
        value, dtype = exp[name]
        expect(info["dtype"] == dtype, f"deserialize {name}: dtype {info['dtype']}")
        expect(list(info["shape"]) == list(value.shape),
               f"deserialize {name}: shape {info['shape']}, expected {list(value.shape)}")
        data = bytes(info["data"])
        expect(data == value.tobytes(), f"deserialize {name}: bytes {data.hex()}, expected {value.tobytes().hex()}")
    if len(problems) == before:
        print(f"{path.name}: {len(exp)} tensors (10 dtypes, bf16 by its bits) and the metadata as written")


def check_reference_order(path):
    exp = {k: v for k, (v, dtype) in expected().items() if dtype != "BF16"}
    loaded = load_file(str(path))
    expect(sorted(loaded) == sorted(exp), f"{path.name}: load_file names {sorted(loaded)}")
    for name, value in exp.items():
        got = loaded.get(name)
        ok = got is not None and got.dtype == value.dtype and np.array_equal(got, value)
        expect(ok, f"{path.name}: load_file {name}: {got!r}, expected {value!r}")
    ours = path.read_bytes()
    theirs = save(exp, metadata={"format": "trident"})
    if ours != theirs:
        expect(False, f"{path.name}: {len(ours)} bytes differ from safetensors.numpy.save's {len(theirs)}:\n"
                      f"  ours   {ours[:300]!r}\n  theirs {theirs[:300]!r}")
        return
    print(f"{path.name}: byte for byte what safetensors {safetensors.__version__} writes for the same arrays")


def write_python_file(path):
    # safetensors_tool.cpp, check_python_file, expects exactly these.
    k = np.arange(12)
    tensors = {
        "weight": (k * 0.75 - 4.0).astype(np.float32).reshape(3, 4),
        "half": ((np.arange(5) - 2.0) * 0.125).astype(np.float16),
        "ids": (np.arange(6) * np.arange(6) - 10).astype(np.int32).reshape(2, 3),
    }
    save_file(tensors, str(path), metadata={"source": "safetensors-python", "note": 'caf\u00e9 "quoted"\n'})
    _, n, header = header_of(path)
    order = [k for k in header if k != "__metadata__"]
    print(f"wrote {path.name}: header {n} bytes (multiple of 8: {n % 8 == 0}), tensors in the order {order}")


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    work = Path(sys.argv[1])
    print(f"safetensors {safetensors.__version__}, numpy {np.__version__}")
    check_dtypes(work / "trident_dtypes.safetensors")
    check_reference_order(work / "trident_reference_order.safetensors")
    write_python_file(work / "python_written.safetensors")
    if problems:
        print(f"{len(problems)} problem(s)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
