#include "kernels/cpu/packed_blocks.h"

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/quant/dequant.h"
#include "kernels/quant/half.h"

// The scales are computed, and the weights unpacked, by the operations of
// kernels/quant/dequant.cc in the same order (this file is built with
// -ffp-contract=off), which is what keeps packed rows bit-identical to it.

namespace kvd::kernels::cpu {
namespace {

float Half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof(h));
  return Fp16ToFp32(h);
}

float F32(const uint8_t* p) {
  float f;
  std::memcpy(&f, p, sizeof(f));
  return f;
}

void PutF32(uint8_t* p, float f) { std::memcpy(p, &f, sizeof(f)); }

void PackBlock(GgmlType type, const uint8_t* b, uint8_t* o) {
  switch (type) {
    case GgmlType::kQ4_0:  // {d; qs[16]}
      PutF32(o, Half(b));
      std::memcpy(o + 4, b + 2, 16);
      return;
    case GgmlType::kQ4_1:  // {d; m; qs[16]}
      PutF32(o, Half(b));
      PutF32(o + 4, Half(b + 2));
      std::memcpy(o + 8, b + 4, 16);
      return;
    case GgmlType::kQ5_0:  // {d; qh; qs[16]}
      PutF32(o, Half(b));
      std::memcpy(o + 4, b + 2, 20);
      return;
    case GgmlType::kQ5_1:  // {d; m; qh; qs[16]}
      PutF32(o, Half(b));
      PutF32(o + 4, Half(b + 2));
      std::memcpy(o + 8, b + 4, 20);
      return;
    case GgmlType::kQ8_0:  // {d; qs[32]}
      PutF32(o, Half(b));
      std::memcpy(o + 4, b + 2, 32);
      return;
    case GgmlType::kQ4_K:    // {d; dmin; scales[12]; qs[128]}
    case GgmlType::kQ5_K: {  // {d; dmin; scales[12]; qh[32]; qs[128]}
      const float d = Half(b), dmin = Half(b + 2);
      for (int j = 0; j < 8; ++j) {
        uint8_t sc, m;
        KQuantScaleMin(j, b + 4, &sc, &m);
        PutF32(o + 4 * j, d * sc);
        PutF32(o + 32 + 4 * j, dmin * m);
      }
      std::memcpy(o + 64, b + 16, type == GgmlType::kQ4_K ? 128 : 160);
      return;
    }
    case GgmlType::kQ6_K: {  // {ql[128]; qh[64]; scales[16]; d}
      const float d = Half(b + 208);
      const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
      for (int j = 0; j < 16; ++j) PutF32(o + 4 * j, d * sc[j]);
      std::memcpy(o + 64, b, 192);
      return;
    }
    case GgmlType::kF16:
      std::memcpy(o, b, 32);
      return;
    default:
      return;
  }
}

void UnpackBlock(GgmlType type, const uint8_t* b, float* y) {
  switch (type) {
    case GgmlType::kQ4_0: {
      const float d = F32(b);
      for (int j = 0; j < 16; ++j) {
        const int x0 = (b[4 + j] & 0x0f) - 8, x1 = (b[4 + j] >> 4) - 8;
        y[j] = x0 * d;
        y[j + 16] = x1 * d;
      }
      return;
    }
    case GgmlType::kQ4_1: {
      const float d = F32(b), m = F32(b + 4);
      for (int j = 0; j < 16; ++j) {
        const int x0 = b[8 + j] & 0x0f, x1 = b[8 + j] >> 4;
        y[j] = x0 * d + m;
        y[j + 16] = x1 * d + m;
      }
      return;
    }
    case GgmlType::kQ5_0:
    case GgmlType::kQ5_1: {
      const bool has_min = type == GgmlType::kQ5_1;
      const float d = F32(b), m = has_min ? F32(b + 4) : 0.0f;
      const uint8_t* p = b + (has_min ? 8 : 4);
      uint32_t qh;
      std::memcpy(&qh, p, sizeof(qh));
      const uint8_t* qs = p + 4;
      for (int j = 0; j < 16; ++j) {
        const int x0 = (qs[j] & 0x0f) | (((qh >> j) << 4) & 0x10);
        const int x1 = (qs[j] >> 4) | ((qh >> (j + 12)) & 0x10);
        if (has_min) {
          y[j] = x0 * d + m;
          y[j + 16] = x1 * d + m;
        } else {
          y[j] = (x0 - 16) * d;
          y[j + 16] = (x1 - 16) * d;
        }
      }
      return;
    }
    case GgmlType::kQ8_0: {
      const float d = F32(b);
      for (int j = 0; j < 32; ++j) y[j] = static_cast<int8_t>(b[4 + j]) * d;
      return;
    }
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K: {
      const bool five = type == GgmlType::kQ5_K;
      const uint8_t* qh = b + 64;
      const uint8_t* q = b + (five ? 96 : 64);
      for (int c = 0; c < 4; ++c, q += 32, y += 64) {
        const float d1 = F32(b + 8 * c), d2 = F32(b + 8 * c + 4);
        const float m1 = F32(b + 32 + 8 * c), m2 = F32(b + 32 + 8 * c + 4);
        for (int l = 0; l < 32; ++l) {
          const int h1 = five && (qh[l] >> (2 * c) & 1) ? 16 : 0;
          const int h2 = five && (qh[l] >> (2 * c + 1) & 1) ? 16 : 0;
          y[l] = d1 * ((q[l] & 0x0f) + h1) - m1;
          y[l + 32] = d2 * ((q[l] >> 4) + h2) - m2;
        }
      }
      return;
    }
    case GgmlType::kQ6_K: {
      for (int half = 0; half < 2; ++half, y += 128) {
        const uint8_t* ql = b + 64 + 64 * half;
        const uint8_t* qh = b + 192 + 32 * half;
        const uint8_t* s = b + 32 * half;  // 8 scales per half
        for (int l = 0; l < 32; ++l) {
          const int is = l / 16;
          const int q1 = ((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
          const int q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
          const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
          const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
          y[l] = F32(s + 4 * (is + 0)) * q1;
          y[l + 32] = F32(s + 4 * (is + 2)) * q2;
          y[l + 64] = F32(s + 4 * (is + 4)) * q3;
          y[l + 96] = F32(s + 4 * (is + 6)) * q4;
        }
      }
      return;
    }
    case GgmlType::kF16:
      for (int j = 0; j < 16; ++j) y[j] = Half(b + 2 * j);
      return;
    default:
      return;
  }
}

}  // namespace

bool IsGemmBlockType(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_0:
    case GgmlType::kQ5_1:
    case GgmlType::kQ8_0:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K:
    case GgmlType::kF16:
      return true;
    default:
      return false;
  }
}

int64_t PackedBlockSize(GgmlType type) {
  return type == GgmlType::kF16 ? 16 : BlockSize(type);
}

int64_t PackedBlockBytes(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0:
      return 20;
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_0:
      return 24;
    case GgmlType::kQ5_1:
      return 28;
    case GgmlType::kQ8_0:
      return 36;
    case GgmlType::kQ4_K:
      return 192;
    case GgmlType::kQ5_K:
      return 224;
    case GgmlType::kQ6_K:
      return 256;
    case GgmlType::kF16:
      return 32;
    default:
      return 0;
  }
}

int64_t PackedRowBytes(GgmlType type, int64_t k) {
  return k / PackedBlockSize(type) * PackedBlockBytes(type);
}

absl::Status PackRow(GgmlType type, const void* src, size_t src_bytes,
                     int64_t k, uint8_t* dst) {
  if (!IsGemmBlockType(type) || k < 0 || k % PackedBlockSize(type) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot pack ", k, " elements of GGML type ",
                     std::string(GgmlTypeName(type)), " into GEMM blocks"));
  }
  const int64_t per = PackedBlockSize(type);
  const int64_t in_bytes = per * BlockBytes(type) / BlockSize(type);
  if (static_cast<int64_t>(src_bytes) < k / per * in_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "packing ", k, " elements of type ", std::string(GgmlTypeName(type)),
        " needs ", k / per * in_bytes, " bytes but only ", src_bytes,
        " were given"));
  }
  const auto* b = static_cast<const uint8_t*>(src);
  for (int64_t i = 0; i < k / per; ++i)
    PackBlock(type, b + i * in_bytes, dst + i * PackedBlockBytes(type));
  return absl::OkStatus();
}

void UnpackRow(GgmlType type, const uint8_t* packed, int64_t k, float* dst,
               bool round_to_bf16) {
  const int64_t per = PackedBlockSize(type);
  for (int64_t i = 0; i < k / per; ++i)
    UnpackBlock(type, packed + i * PackedBlockBytes(type), dst + i * per);
  if (!round_to_bf16) return;
  // kernels/cpu/elementwise.h's FloatToBf16, which this library sits below.
  for (int64_t i = 0; i < k; ++i) {
    uint32_t b;
    std::memcpy(&b, &dst[i], sizeof(b));
    if ((b & 0x7fffffffu) > 0x7f800000u) {
      b = (b & 0xffff0000u) | 0x00400000u;
    } else {
      b = (b + 0x7fffu + ((b >> 16) & 1u)) & 0xffff0000u;
    }
    std::memcpy(&dst[i], &b, sizeof(b));
  }
}

}  // namespace kvd::kernels::cpu
