#!/usr/bin/env python3
"""Extracts real GGUF tensors (raw quantized bytes) into a small fixture for the
device dequantization test (kernels/cuda/dequant_test.cc), since the model
files are too large to carry to the lent GPU machine.

    python3 tools/gpu/make_dequant_fixture.py tools/gpu/bin/dequant_fixture.bin \
        /root/.cache/kvd/models/SmolLM2-135M-Instruct.Q4_1.gguf \
        /root/.cache/kvd/models/gemma-3-270m-q4_k_m.gguf

Per model and GGML type: up to two tensors, each cut to its first rows so that
it holds at most --max-bytes bytes. Reads the files with the `gguf` PyPI
package (independent of kvd's reader). Only bytes are copied; the expected
values come from kvd's CPU dequantizer inside the test.

Format (little-endian): b"KVDQFIX1", u32 count, then per tensor: u32 name
length, name (utf-8), u32 GGML type id, i64 rows, i64 cols, u64 byte count,
bytes (rows contiguous).
"""
import argparse
import collections
import struct
import sys

import gguf
import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("models", nargs="+")
    ap.add_argument("--max-bytes", type=int, default=384 * 1024)
    ap.add_argument("--per-type", type=int, default=2)
    args = ap.parse_args()
    entries = []
    for path in args.models:
        reader = gguf.GGUFReader(path)
        taken = collections.Counter()
        for t in reader.tensors:
            type_id = int(t.tensor_type)
            if taken[type_id] >= args.per_type:
                continue
            cols = int(t.shape[0])  # GGUF dims: ne[0] is the row length
            rows = int(np.prod(t.shape[1:])) if len(t.shape) > 1 else 1
            raw = np.ascontiguousarray(t.data).view(np.uint8).reshape(-1)
            row_bytes = raw.size // rows
            keep = max(1, min(rows, args.max_bytes // row_bytes))
            name = f"{path.rsplit('/', 1)[-1]}:{t.name}"
            entries.append((name, type_id, keep, cols, raw[: keep * row_bytes].tobytes()))
            taken[type_id] += 1
    with open(args.out, "wb") as f:
        f.write(b"KVDQFIX1")
        f.write(struct.pack("<I", len(entries)))
        for name, type_id, rows, cols, data in entries:
            nb = name.encode()
            f.write(struct.pack("<I", len(nb)))
            f.write(nb)
            f.write(struct.pack("<IqqQ", type_id, rows, cols, len(data)))
            f.write(data)
    total = sum(len(e[4]) for e in entries)
    for name, type_id, rows, cols, data in entries:
        print(f"{name}: type {gguf.GGMLQuantizationType(type_id).name}, {rows} x {cols}, {len(data)} bytes")
    print(f"{len(entries)} tensors, {total} bytes -> {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
