#!/usr/bin/env python3
"""Golden session export file for storage/checkpoint/session_file_test.cc.

Writes the layout documented in storage/checkpoint/session_file.h with an
implementation independent of the C++ one: Python protobuf for the manifest
and chunk headers, the PyPI `crc32c` package for every checksum.

    pip install protobuf crc32c
    protoc -I. --python_out=/tmp/kvdpy proto/kvd/v1/checkpoint.proto
    PYTHONPATH=/tmp/kvdpy python3 tools/reference/make_session_file_golden.py \
        storage/checkpoint/testdata/session_file/golden_v1.kvds

The session (tenant "golden", session "s-1", kv-direct at layers 1 and 3,
chunk_tokens 3, bf16 rows of 6 bytes, 8 tokens, length 7, turn ends 5 and 8,
layer 3 keeps positions 3..) must match kGolden* in session_file_test.cc.
Payload byte i of chunk (layer, index) is (layer * 7 + index * 13 + i) & 0xFF,
with the token layer as -1.
"""
import struct
import sys

import crc32c
from proto.kvd.v1 import checkpoint_pb2 as pb

C = 3
ROW_BYTES = 6
TOKENS = 8
LENGTH = 7


def payload(layer, index, n):
    return bytes(((layer * 7 + index * 13 + i) & 0xFF) for i in range(n))


def varint(n):
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def chunk(layer, index, count):
    rows = min(C, count - index * C)
    tokens = layer == -1
    row_bytes = 4 if tokens else ROW_BYTES
    data = payload(layer, index, rows * row_bytes)
    h = pb.ChunkHeader(layer=layer, chunk_index=index, first_position=index * C,
                       rows=rows,
                       dtype=pb.DTYPE_I32 if tokens else pb.DTYPE_BF16,
                       row_bytes=row_bytes, crc32c=crc32c.crc32c(data))
    hb = h.SerializeToString()
    return varint(len(hb)) + hb + data


def main():
    m = pb.SessionManifest(
        format_version=1, tenant="golden", session_id="s-1", policy="kv-direct",
        layers=[1, 3], chunk_tokens=C, dtype=pb.DTYPE_BF16, row_bytes=ROW_BYTES,
        token_count=TOKENS, length=LENGTH, turn_ends=[5, 8],
        first_position=[0, 3], created_unix_ms=1700000000000)
    m.model.model_name = "golden-model"
    m.model.fingerprint = "c0ffee"
    m.model.precision = "bf16"
    m.model.numerics_version = 2
    m.labels["title"] = "golden"
    chunks = {}
    for i in range((TOKENS + C - 1) // C):
        chunks[(-1, i)] = chunk(-1, i, TOKENS)
    for layer, first in ((1, 0), (3, 3)):
        for i in range(first // C, (LENGTH + C - 1) // C):
            chunks[(layer, i)] = chunk(layer, i, LENGTH)
    # stored_bytes counts payload bytes: 4 per token, ROW_BYTES per residual
    # row (readers refuse a file whose manifest misstates it).
    m.stored_bytes = TOKENS * 4 + ((LENGTH - 0) + (LENGTH - 3)) * ROW_BYTES
    mb = m.SerializeToString()
    f = b"KVDSESS\0" + struct.pack("<IIQ", 1, 1, len(mb)) + mb
    for (layer, index) in sorted(chunks):
        v = chunks[(layer, index)]
        f += b"C" + struct.pack("<qqQ", layer, index, len(v)) + v
    f += b"E" + struct.pack("<Q", len(chunks))
    f += struct.pack("<I", crc32c.crc32c(f))
    with open(sys.argv[1], "wb") as out:
        out.write(f)
    print(f"wrote {len(f)} bytes, {len(chunks)} chunks to {sys.argv[1]}")


if __name__ == "__main__":
    main()
