#!/usr/bin/env python3
"""Writes golden values for //kernels/quant and //ops/gguf from independent references.

  python3 tools/reference/make_dequant_golden.py tests/golden/dequant ops/gguf/testdata

References: the Python `gguf` package (gguf.quants.dequantize: GGML's block formats, written
independently of kvd) for block dequantization and for fp32 -> bf16 (gguf.quants.BF16, a port of
ggml_compute_fp32_to_bf16); numpy's float16 for fp16 <-> fp32. Tested with gguf 0.19.0 and
numpy 2.4.

Outputs (deterministic for a given seed):
  dequant_golden.json: per GGML type, random blocks (seeded bytes; fp16 scale fields made
      finite, one block with a subnormal scale) as hex, and the expected float32 values as
      hex of little-endian float32 bytes.
  half_golden.json: float32 bit patterns -> fp16 bits (numpy) and bf16 bits (gguf), and
      fp16 bit patterns -> float32 bits (numpy), covering zeros, subnormals, rounding ties,
      overflow, inf and NaN.
  real_model_rows.json: rows of tensors of the two real model files (when present under
      ~/.cache/kvd/models), read and dequantized by gguf.GGUFReader + gguf.quants.dequantize.
  <testdata>/python_writer.gguf (+ .json): a GGUF file written by gguf.GGUFWriter with every
      metadata value type, arrays of every element type and F32/F16/BF16/quantized tensors, and
      a JSON description of its contents. python_writer_align64.gguf (+ .json): the same
      with general.alignment = 64.
"""

import importlib.metadata
import json
import os
import sys

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import BF16, dequantize

SEED = 20261129

# Byte offsets of the fp16 scale fields inside one block (ggml-common.h).
FP16_FIELDS = {
    T.F16: None,  # every 2 bytes are an fp16 value
    T.BF16: None,
    T.F32: None,
    T.Q4_0: [0],
    T.Q4_1: [0, 2],
    T.Q5_0: [0],
    T.Q5_1: [0, 2],
    T.Q8_0: [0],
    T.Q4_K: [0, 2],
    T.Q5_K: [0, 2],
    T.Q6_K: [208],
}


def finite_fp16(rng, subnormal=False):
    """A random finite fp16 bit pattern (or a subnormal one)."""
    bits = int(rng.integers(0, 1 << 16))
    if subnormal:
        bits = (bits & 0x83FF) | 1  # exponent 0, non-zero mantissa
    elif (bits & 0x7C00) == 0x7C00:
        bits &= ~0x4000  # clear the top exponent bit: finite
    return bits


def make_blocks(rng, qtype, n_blocks):
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    raw = bytearray(rng.integers(0, 256, size=n_blocks * type_size, dtype=np.uint8).tobytes())
    if qtype == T.F32:
        vals = rng.standard_normal(n_blocks).astype(np.float32) * np.float32(3.0)
        vals[0] = np.float32(0.0)
        vals[1] = -np.float32(0.0)
        raw = bytearray(vals.tobytes())
        # Special values pass through unchanged: inf, a NaN with payload, a denormal.
        raw += np.array([0x7F800000, 0x7FC12345, 0x00000001], dtype=np.uint32).tobytes()
        return bytes(raw), n_blocks + 3
    if qtype in (T.F16, T.BF16):
        # Every pattern is meaningful here; include inf, NaN and subnormals explicitly.
        special = [0x7C00, 0xFC00, 0x0001, 0x83FF, 0x0400, 0x7BFF] if qtype == T.F16 else \
                  [0x7F80, 0xFF80, 0x0001, 0x8001, 0x0080, 0x7F7F]
        vals = np.frombuffer(bytes(raw), dtype=np.uint16).copy()
        exp_mask = 0x7C00 if qtype == T.F16 else 0x7F80
        vals[(vals & exp_mask) == exp_mask] &= ~np.uint16(0x4000)  # no random NaNs
        vals[:len(special)] = special
        return vals.tobytes(), n_blocks
    for b in range(n_blocks):
        for off in FP16_FIELDS[qtype]:
            h = finite_fp16(rng, subnormal=(b == 1))
            raw[b * type_size + off:b * type_size + off + 2] = h.to_bytes(2, "little")
    return bytes(raw), n_blocks * block_size


def dequant_golden(rng):
    cases = []
    for qtype, n_blocks in [(T.F32, 61), (T.F16, 64), (T.BF16, 64), (T.Q4_0, 4), (T.Q4_1, 4),
                            (T.Q5_0, 4), (T.Q5_1, 4), (T.Q8_0, 4), (T.Q4_K, 3), (T.Q5_K, 3),
                            (T.Q6_K, 3)]:
        raw, n = make_blocks(rng, qtype, n_blocks)
        arr = np.frombuffer(raw, dtype=np.uint8).reshape(1, -1)
        out = dequantize(arr, qtype)
        out = np.asarray(out, dtype=np.float32).reshape(-1)
        assert out.size == n, (qtype.name, out.size, n)
        cases.append({
            "type": qtype.name,
            "type_id": int(qtype),
            "n": n,
            "src_hex": raw.hex(),
            "expected_f32_hex": out.astype("<f4").tobytes().hex(),
        })
    return {"seed": SEED, "gguf_version": importlib.metadata.version("gguf"),
            "cases": cases}


def f32(bits):
    return np.array(bits, dtype=np.uint32)


def half_golden(rng):
    specials = [
        0x00000000, 0x80000000, 0x00000001, 0x80800000,  # zeros, fp32 denormal, fp32 min normal
        0x33000000,  # 2^-25: exactly half of the smallest fp16 subnormal -> ties to 0
        0x33000001,  # just above 2^-25 -> smallest subnormal
        0x33C00000,  # 1.5 * 2^-24 -> tie between subnormals 1 and 2 -> 2 (even)
        0x34200000,  # 2.5 * 2^-24 -> tie -> 2
        0x387FC000,  # just below 2^-14: largest subnormal region, ties to normal
        0x387FE000, 0x38800000, 0x38801000,
        0x3F800000, 0x3F801000,  # 1, 1 + 2^-11 (tie -> 1)
        0x3F803000,  # 1 + 3 * 2^-11 (tie -> up, even)
        0x3F801001, 0x3F800FFF,
        0x477FE000,  # 65504 (max fp16)
        0x477FEFFF,  # just below 65520 -> 65504
        0x477FF000,  # 65520 -> tie -> inf
        0x47800000,  # 65536 -> inf
        0x7F7FFFFF,  # max float -> inf (fp16), bf16 rounds to inf
        0x7F7F7FFF,  # bf16 round-down near max
        0x7F800000, 0xFF800000,  # inf
        0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FC12345, 0xFFA00000, 0x7FBFE000,  # NaNs
        0x3F808000,  # bf16 tie, even -> down
        0x3F818000,  # bf16 tie, odd -> up
        0x3F808001,  # bf16 just above tie -> up
    ]
    exps = rng.integers(90, 160, size=1500).astype(np.uint32)
    mant = rng.integers(0, 1 << 23, size=1500).astype(np.uint32)
    sign = rng.integers(0, 2, size=1500).astype(np.uint32)
    rand = (sign << 31) | (exps << 23) | mant
    f32_bits = np.concatenate([f32(specials), rand])
    f32_vals = f32_bits.view(np.float32)
    with np.errstate(over="ignore"):
        to_fp16 = f32_vals.astype(np.float16).view(np.uint16)
    to_bf16 = BF16.quantize_blocks(f32_vals.reshape(1, -1)).view(np.uint16).reshape(-1)

    # fp16 -> fp32: every subnormal, every inf/NaN pattern with sign, and a stride over the rest.
    h = list(range(0, 0x400)) + list(range(0x8000, 0x8400)) + list(range(0x7C00, 0x8000)) + \
        list(range(0xFC00, 0x10000)) + list(range(0x400, 0x7C00, 29)) + list(range(0x8400, 0xFC00, 31))
    h_bits = np.array(h, dtype=np.uint16)
    h_to_f32 = h_bits.view(np.float16).astype(np.float32).view(np.uint32)
    return {
        "f32_bits": [int(x) for x in f32_bits],
        "fp16_bits": [int(x) for x in to_fp16],
        "bf16_bits": [int(x) for x in to_bf16],
        "fp16_in": [int(x) for x in h_bits],
        "fp16_to_f32_bits": [int(x) for x in h_to_f32],
    }


MODELS = os.path.expanduser("~/.cache/kvd/models")
REAL_ROWS = [
    ("SmolLM2-135M-Instruct.Q4_1.gguf", "token_embd.weight", [0, 49151]),   # Q8_0
    ("SmolLM2-135M-Instruct.Q4_1.gguf", "blk.0.ffn_down.weight", [0, 575]),  # Q4_1
    ("SmolLM2-135M-Instruct.Q4_1.gguf", "blk.0.attn_norm.weight", [0]),     # F32
    ("gemma-3-270m-q4_k_m.gguf", "token_embd.weight", [100]),             # Q8_0
    ("gemma-3-270m-q4_k_m.gguf", "blk.0.attn_k.weight", [0, 255]),         # Q5_0
    ("gemma-3-270m-q4_k_m.gguf", "blk.0.attn_output.weight", [7]),         # Q4_K
    ("gemma-3-270m-q4_k_m.gguf", "blk.0.ffn_down.weight", [639]),          # Q6_K
]


def real_model_rows():
    rows = []
    readers = {}
    for file, name, row_ids in REAL_ROWS:
        path = os.path.join(MODELS, file)
        if not os.path.exists(path):
            print(f"skipping {path}: not present", file=sys.stderr)
            continue
        if file not in readers:
            readers[file] = gguf.GGUFReader(path)
        t = next(t for t in readers[file].tensors if t.name == name)
        # t.data holds bytes per row for quantized tensors, values for F32; make it 2-D.
        n_rows = int(np.prod(t.shape[1:])) if len(t.shape) > 1 else 1
        data = np.asarray(t.data).reshape(n_rows, -1)
        for r in row_ids:
            row = dequantize(data[r:r + 1].copy(), t.tensor_type).reshape(-1).astype("<f4")
            rows.append({"file": file, "tensor": name, "type": t.tensor_type.name, "row": r,
                         "row_length": int(t.shape[0]), "expected_f32_hex": row.tobytes().hex()})
    return {"rows": rows}


def u32(f):
    return int(np.array([f], dtype="<f4").view("<u4")[0])


def u64(f):
    return int(np.array([f], dtype="<f8").view("<u8")[0])


def python_writer_file(rng, path, alignment):
    """Writes a GGUF with gguf.GGUFWriter and returns a JSON description of what it holds."""
    V = gguf.GGUFValueType
    w = gguf.GGUFWriter(path, "testarch")
    kvs = [{"key": "general.architecture", "type": "string", "hex": b"testarch".hex()}]
    if alignment != 32:
        w.add_custom_alignment(alignment)
        kvs.append({"key": "general.alignment", "type": "uint32", "value": alignment})
    scalars = [
        ("t.u8", V.UINT8, "uint8", 200), ("t.i8", V.INT8, "int8", -100),
        ("t.u16", V.UINT16, "uint16", 60000), ("t.i16", V.INT16, "int16", -30000),
        ("t.u32", V.UINT32, "uint32", 4000000000), ("t.i32", V.INT32, "int32", -2000000000),
        ("t.u64", V.UINT64, "uint64", 2**63 + 5), ("t.i64", V.INT64, "int64", -2**62 - 3),
        ("t.bool_true", V.BOOL, "bool", True), ("t.bool_false", V.BOOL, "bool", False),
    ]
    for key, vt, tname, val in scalars:
        w.add_key_value(key, val, vt)
        kvs.append({"key": key, "type": tname, "value": val})
    w.add_key_value("t.f32", 0.1, V.FLOAT32)
    kvs.append({"key": "t.f32", "type": "float32", "bits": u32(0.1)})
    w.add_key_value("t.f64", -1.25e300, V.FLOAT64)
    kvs.append({"key": "t.f64", "type": "float64", "bits": u64(-1.25e300)})
    text = "h\u00e9llo \u263a\u0000tail"
    w.add_key_value("t.str", text, V.STRING)
    kvs.append({"key": "t.str", "type": "string", "hex": text.encode().hex()})
    w.add_key_value("t.empty_str", "", V.STRING)
    kvs.append({"key": "t.empty_str", "type": "string", "hex": ""})
    arrays = [
        ("a.u8", V.UINT8, "uint8", [1, 2, 255]), ("a.i8", V.INT8, "int8", [-128, 0, 127]),
        ("a.u16", V.UINT16, "uint16", [65535, 7]), ("a.i16", V.INT16, "int16", [-32768, 5]),
        ("a.u32", V.UINT32, "uint32", [4294967295, 0, 3]),
        ("a.i32", V.INT32, "int32", [3, 3, 1, -5, 2147483647]),
        ("a.u64", V.UINT64, "uint64", [2**64 - 1, 1]), ("a.i64", V.INT64, "int64", [-2**63, 9]),
        ("a.bool", V.BOOL, "bool", [True, False, True]),
    ]
    for key, vt, tname, vals in arrays:
        w.add_key_value(key, vals, V.ARRAY, sub_type=vt)
        kvs.append({"key": key, "type": "array", "elem": tname, "values": vals})
    f32s = [-1000.0, 0.5, float("inf"), 1e-40]
    w.add_key_value("a.f32", f32s, V.ARRAY, sub_type=V.FLOAT32)
    kvs.append({"key": "a.f32", "type": "array", "elem": "float32", "bits": [u32(x) for x in f32s]})
    f64s = [3.141592653589793, -0.0]
    w.add_key_value("a.f64", f64s, V.ARRAY, sub_type=V.FLOAT64)
    kvs.append({"key": "a.f64", "type": "array", "elem": "float64", "bits": [u64(x) for x in f64s]})
    strs = ["<s>", "", "\u0120a b", "\u2581\u2581x"]
    w.add_key_value("a.str", strs, V.ARRAY, sub_type=V.STRING)
    kvs.append({"key": "a.str", "type": "array", "elem": "string",
                "hex": [x.encode().hex() for x in strs]})

    tensors = []

    def add(name, np_shape, qtype, raw, floats=None):
        # GGUFWriter takes numpy shapes (outermost first); GGML dims are the reverse.
        w.add_tensor(name, np.frombuffer(raw, dtype=np.uint8).reshape(-1).copy()
                     if qtype not in (T.F32, T.F16) else
                     np.frombuffer(raw, dtype=np.float32 if qtype == T.F32 else np.float16)
                     .reshape(np_shape).copy(),
                     raw_shape=None if qtype in (T.F32, T.F16) else
                     list(np_shape[:-1]) + [len(raw) // int(np.prod(np_shape[:-1]))],
                     raw_dtype=None if qtype in (T.F32, T.F16) else qtype)
        entry = {"name": name, "type": qtype.name, "type_id": int(qtype),
                 "dims": list(reversed(np_shape)), "data_hex": raw.hex()}
        if floats is not None:
            entry["source_f32_hex"] = floats.astype("<f4").tobytes().hex()
        tensors.append(entry)

    x = (rng.standard_normal((2, 3)) * 10).astype(np.float32)
    add("t.f32", (2, 3), T.F32, x.tobytes())
    h = rng.standard_normal(8).astype(np.float32)
    add("t.f16", (8,), T.F16, h.astype(np.float16).tobytes(), floats=h)
    b = rng.standard_normal((3, 2)).astype(np.float32)
    add("t.bf16", (3, 2), T.BF16, gguf.quants.quantize(b, T.BF16).tobytes(), floats=b)
    q = rng.standard_normal((2, 64)).astype(np.float32)
    add("blk.0.q8_0", (2, 64), T.Q8_0, gguf.quants.quantize(q, T.Q8_0).tobytes())
    add("blk.0.q5_0", (1, 32), T.Q5_0, gguf.quants.quantize(q[:1, :32], T.Q5_0).tobytes())
    raw, _ = make_blocks(rng, T.Q4_K, 1)
    add("blk.0.q4_k", (1, 256), T.Q4_K, raw)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return {"alignment": alignment, "kv": kvs, "tensors": tensors}


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "tests/golden/dequant"
    testdata_dir = sys.argv[2] if len(sys.argv) > 2 else "ops/gguf/testdata"
    rng = np.random.default_rng(SEED)
    with open(os.path.join(out_dir, "dequant_golden.json"), "w") as f:
        json.dump(dequant_golden(rng), f, indent=1)
        f.write("\n")
    with open(os.path.join(out_dir, "half_golden.json"), "w") as f:
        json.dump(half_golden(rng), f, separators=(",", ":"))
        f.write("\n")
    with open(os.path.join(out_dir, "real_model_rows.json"), "w") as f:
        json.dump(real_model_rows(), f, indent=1)
        f.write("\n")
    for name, alignment in [("python_writer", 32), ("python_writer_align64", 64)]:
        desc = python_writer_file(rng, os.path.join(testdata_dir, name + ".gguf"), alignment)
        with open(os.path.join(testdata_dir, name + ".json"), "w") as f:
            json.dump(desc, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
