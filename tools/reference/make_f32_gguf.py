#!/usr/bin/env python3
"""Rewrites a quantized GGUF as an F32 (or F16) GGUF for the llama.cpp reference.

kvd's fp32 mode dequantizes the quantized file to fp32 at load time. To compare
against an independent implementation computing with *exactly* those weights,
every tensor is dequantized here with the Python `gguf` package
(`gguf.quants.dequantize`, independent of kvd's C++ dequantizers) and written
back as float32. llama.cpp then runs the model in fp32 on identical weights.

The F16 variant (--type f16) stores every tensor of rank >= 2 in float16 and
keeps 1-D tensors (norm weights, biases) in float32, as llama.cpp's own
converter does. It only serves benchmarks: its weights are *not* the ones kvd's
fp32 mode uses.

All metadata is copied unchanged except `general.file_type`, which is set to
ALL_F32 (0) or MOSTLY_F16 (1) so that tools describe the file correctly.

Outputs go to the model cache, never into the repository.

Commands used (gguf 0.19.0, numpy 2.4.6, Python 3.11.7, 2026-11-29):
  python3 tools/reference/make_f32_gguf.py \
      /root/.cache/kvd/models/SmolLM2-135M-Instruct.Q4_1.gguf
  python3 tools/reference/make_f32_gguf.py \
      /root/.cache/kvd/models/gemma-3-270m-q4_k_m.gguf
  python3 tools/reference/make_f32_gguf.py --type f16 \
      /root/.cache/kvd/models/SmolLM2-135M-Instruct.Q4_1.gguf
which write /root/.cache/kvd/models/ref/<stem>.f32.gguf (or .f16.gguf).
"""

import argparse
import os
import sys

import numpy as np
import gguf

DEFAULT_OUT_DIR = os.path.expanduser("~/.cache/kvd/models/ref")


def dequantized(tensor) -> np.ndarray:
    """Returns the tensor as float32 with numpy shape (ne[n-1], ..., ne[0])."""
    shape = tuple(int(d) for d in reversed(tensor.shape))
    data = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    data = np.ascontiguousarray(data, dtype=np.float32).reshape(shape)
    return data


def out_dtype(tensor, want: str) -> type:
    if want == "f16" and len(tensor.shape) >= 2:
        return np.float16
    return np.float32


def convert(src: str, dst: str, want: str) -> None:
    reader = gguf.GGUFReader(src)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(dst, arch=arch, endianess=reader.endianess)

    file_type = (gguf.LlamaFileType.ALL_F32
                 if want == "f32" else gguf.LlamaFileType.MOSTLY_F16)
    alignment = reader.fields.get(gguf.Keys.General.ALIGNMENT)
    if alignment is not None:
        writer.add_custom_alignment(int(alignment.contents()))

    for field in reader.fields.values():
        # GGUF.* are virtual header fields, the writer emits the architecture
        # and the alignment itself.
        if (field.name.startswith("GGUF.") or
                field.name == gguf.Keys.General.ARCHITECTURE or
                field.name == gguf.Keys.General.ALIGNMENT):
            continue
        val_type = field.types[0]
        sub_type = (field.types[-1]
                    if val_type == gguf.GGUFValueType.ARRAY else None)
        value = field.contents()
        if field.name == gguf.Keys.General.FILE_TYPE:
            value = int(file_type)
        writer.add_key_value(field.name, value, val_type, sub_type=sub_type)

    for t in reader.tensors:
        shape = tuple(int(d) for d in reversed(t.shape))
        dtype = np.dtype(out_dtype(t, want))
        nbytes = int(np.prod(shape)) * dtype.itemsize
        writer.add_tensor_info(t.name, shape, dtype, nbytes)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in reader.tensors:
        data = dequantized(t)
        dtype = out_dtype(t, want)
        if dtype == np.float16:
            if not np.all(np.isfinite(data.astype(np.float16))):
                sys.exit(f"{src}: tensor {t.name} overflows float16")
            data = data.astype(np.float16)
        writer.write_tensor_data(data)
    writer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", help="quantized GGUF file")
    parser.add_argument("--type", choices=("f32", "f16"), default="f32")
    parser.add_argument("--out", help="output path (default: "
                        f"{DEFAULT_OUT_DIR}/<stem>.<type>.gguf)")
    args = parser.parse_args()

    dst = args.out
    if dst is None:
        stem = os.path.basename(args.src)
        if stem.endswith(".gguf"):
            stem = stem[:-len(".gguf")]
        os.makedirs(DEFAULT_OUT_DIR, exist_ok=True)
        dst = os.path.join(DEFAULT_OUT_DIR, f"{stem}.{args.type}.gguf")
    tmp = dst + ".tmp"
    convert(args.src, tmp, args.type)
    os.replace(tmp, dst)
    print(dst)


if __name__ == "__main__":
    main()
