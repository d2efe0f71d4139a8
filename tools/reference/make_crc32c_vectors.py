#!/usr/bin/env python3
"""Golden CRC32C (Castagnoli) values for storage/checkpoint/crc32c_test.cc.

Two independent implementations must agree before a value is printed: the PyPI
packages `crc32c` (ICRAR) and `google-crc32c` (Google's C library binding).

    pip install crc32c google-crc32c
    python3 tools/reference/make_crc32c_vectors.py

The inputs are a deterministic byte stream that the C++ test regenerates
(LcgBytes: x = x * 1103515245 + 12345 mod 2^32, byte = x >> 24, x0 = seed)
at lengths that cover the 8-byte main loop, its head/tail and long inputs.
Paste the output into kLcgVectors in crc32c_test.cc.
"""
import crc32c
import google_crc32c


def lcg_bytes(seed: int, n: int) -> bytes:
    x = seed & 0xFFFFFFFF
    out = bytearray()
    for _ in range(n):
        x = (x * 1103515245 + 12345) & 0xFFFFFFFF
        out.append(x >> 24)
    return bytes(out)


def main() -> None:
    cases = [(1, n) for n in (0, 1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 63, 64, 65, 255)]
    cases += [(7, 1000), (42, 4099), (2024, 65536 + 5)]
    for seed, n in cases:
        data = lcg_bytes(seed, n)
        a = crc32c.crc32c(data)
        b = int.from_bytes(google_crc32c.Checksum(data).digest(), "big")
        assert a == b, (seed, n, a, b)
        print(f"    {{{seed}, {n}, 0x{a:08X}u}},")
    # RFC 3720 B.4 and the classic check value, as a cross-check of the packages.
    assert crc32c.crc32c(b"\x00" * 32) == 0x8A9136AA
    assert crc32c.crc32c(b"\xff" * 32) == 0x62A8AB43
    assert crc32c.crc32c(bytes(range(32))) == 0x46DD794E
    assert crc32c.crc32c(bytes(range(31, -1, -1))) == 0x113FDB5C
    assert crc32c.crc32c(b"123456789") == 0xE3069283


if __name__ == "__main__":
    main()
