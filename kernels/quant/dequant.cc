#include "kernels/quant/dequant.h"

#include <cstdint>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/quant/ggml_type.h"
#include "kernels/quant/half.h"

// Block layouts follow GGML's ggml-common.h; the arithmetic mirrors the scalar
// dequantize_row_* functions of ggml-quants.c term by term (same products, same
// order), which is what makes the results bit-identical. Blocks are read
// byte-wise, so `src` needs no alignment.

namespace kvd::kernels {
namespace {

constexpr int kQK = 32;     // elements per Q4_0..Q8_0 block
constexpr int kQK_K = 256;  // elements per K-quant super-block

float LoadFp16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof(h));
  return Fp16ToFp32(h);
}

uint32_t LoadU32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// block_q4_0 {fp16 d; uint8 qs[16]}: x[j] = (lo(qs[j]) - 8) * d, x[j+16] =
// (hi(qs[j]) - 8) * d.
void DequantQ4_0(const uint8_t* b, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i, b += 18, y += kQK) {
    const float d = LoadFp16(b);
    const uint8_t* qs = b + 2;
    for (int j = 0; j < kQK / 2; ++j) {
      const int x0 = (qs[j] & 0x0f) - 8;
      const int x1 = (qs[j] >> 4) - 8;
      y[j] = x0 * d;
      y[j + kQK / 2] = x1 * d;
    }
  }
}

// block_q4_1 {fp16 d; fp16 m; uint8 qs[16]}: x = q * d + m.
void DequantQ4_1(const uint8_t* b, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i, b += 20, y += kQK) {
    const float d = LoadFp16(b);
    const float m = LoadFp16(b + 2);
    const uint8_t* qs = b + 4;
    for (int j = 0; j < kQK / 2; ++j) {
      const int x0 = qs[j] & 0x0f;
      const int x1 = qs[j] >> 4;
      y[j] = x0 * d + m;
      y[j + kQK / 2] = x1 * d + m;
    }
  }
}

// block_q5_0 {fp16 d; uint32 qh; uint8 qs[16]}: bit j of qh is bit 4 of element
// j.
void DequantQ5_0(const uint8_t* b, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i, b += 22, y += kQK) {
    const float d = LoadFp16(b);
    const uint32_t qh = LoadU32(b + 2);
    const uint8_t* qs = b + 6;
    for (int j = 0; j < kQK / 2; ++j) {
      const uint8_t xh0 = ((qh >> j) << 4) & 0x10;
      const uint8_t xh1 = (qh >> (j + 12)) & 0x10;
      const int x0 = ((qs[j] & 0x0f) | xh0) - 16;
      const int x1 = ((qs[j] >> 4) | xh1) - 16;
      y[j] = x0 * d;
      y[j + kQK / 2] = x1 * d;
    }
  }
}

// block_q5_1 {fp16 d; fp16 m; uint32 qh; uint8 qs[16]}: x = q * d + m.
void DequantQ5_1(const uint8_t* b, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i, b += 24, y += kQK) {
    const float d = LoadFp16(b);
    const float m = LoadFp16(b + 2);
    const uint32_t qh = LoadU32(b + 4);
    const uint8_t* qs = b + 8;
    for (int j = 0; j < kQK / 2; ++j) {
      const uint8_t xh0 = ((qh >> j) << 4) & 0x10;
      const uint8_t xh1 = (qh >> (j + 12)) & 0x10;
      const int x0 = (qs[j] & 0x0f) | xh0;
      const int x1 = (qs[j] >> 4) | xh1;
      y[j] = x0 * d + m;
      y[j + kQK / 2] = x1 * d + m;
    }
  }
}

// block_q8_0 {fp16 d; int8 qs[32]}.
void DequantQ8_0(const uint8_t* b, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i, b += 34, y += kQK) {
    const float d = LoadFp16(b);
    for (int j = 0; j < kQK; ++j) y[j] = static_cast<int8_t>(b[2 + j]) * d;
  }
}

// block_q4_K {fp16 d; fp16 dmin; uint8 scales[12]; uint8 qs[128]}: 8 sub-blocks
// of 32; each 32 qs bytes give two sub-blocks (low nibbles, then high nibbles).
void DequantQ4_K(const uint8_t* b, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i, b += 144) {
    const float d = LoadFp16(b);
    const float min = LoadFp16(b + 2);
    const uint8_t* scales = b + 4;
    const uint8_t* q = b + 16;
    int is = 0;
    for (int j = 0; j < kQK_K; j += 64) {
      uint8_t sc, m;
      KQuantScaleMin(is + 0, scales, &sc, &m);
      const float d1 = d * sc;
      const float m1 = min * m;
      KQuantScaleMin(is + 1, scales, &sc, &m);
      const float d2 = d * sc;
      const float m2 = min * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * (q[l] & 0x0f) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * (q[l] >> 4) - m2;
      q += 32;
      is += 2;
    }
  }
}

// block_q5_K {fp16 d; fp16 dmin; uint8 scales[12]; uint8 qh[32]; uint8
// qs[128]}: as Q4_K, with bit (2k) / (2k+1) of qh[l] the fifth bit of element l
// of sub-block 2k / 2k+1.
void DequantQ5_K(const uint8_t* b, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i, b += 176) {
    const float d = LoadFp16(b);
    const float min = LoadFp16(b + 2);
    const uint8_t* scales = b + 4;
    const uint8_t* qh = b + 16;
    const uint8_t* ql = b + 48;
    int is = 0;
    uint8_t u1 = 1, u2 = 2;
    for (int j = 0; j < kQK_K; j += 64) {
      uint8_t sc, m;
      KQuantScaleMin(is + 0, scales, &sc, &m);
      const float d1 = d * sc;
      const float m1 = min * m;
      KQuantScaleMin(is + 1, scales, &sc, &m);
      const float d2 = d * sc;
      const float m2 = min * m;
      for (int l = 0; l < 32; ++l)
        *y++ = d1 * ((ql[l] & 0x0f) + (qh[l] & u1 ? 16 : 0)) - m1;
      for (int l = 0; l < 32; ++l)
        *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
      ql += 32;
      is += 2;
      u1 <<= 2;
      u2 <<= 2;
    }
  }
}

// block_q6_K {uint8 ql[128]; uint8 qh[64]; int8 scales[16]; fp16 d}: two halves
// of 128; 16 sub-blocks of 16 elements, each with an int8 scale.
void DequantQ6_K(const uint8_t* b, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i, b += 210) {
    const float d = LoadFp16(b + 208);
    const uint8_t* ql = b;
    const uint8_t* qh = b + 128;
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
    for (int n = 0; n < kQK_K; n += 128) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = static_cast<int8_t>((ql[l + 0] & 0x0f) |
                                           (((qh[l] >> 0) & 3) << 4)) -
                       32;
        const int q2 = static_cast<int8_t>((ql[l + 32] & 0x0f) |
                                           (((qh[l] >> 2) & 3) << 4)) -
                       32;
        const int q3 =
            static_cast<int8_t>((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) -
            32;
        const int q4 =
            static_cast<int8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) -
            32;
        y[l + 0] = d * sc[is + 0] * q1;
        y[l + 32] = d * sc[is + 2] * q2;
        y[l + 64] = d * sc[is + 4] * q3;
        y[l + 96] = d * sc[is + 6] * q4;
      }
      y += 128;
      ql += 64;
      qh += 32;
      sc += 8;
    }
  }
}

}  // namespace

// The 12 scale bytes of Q4_K/Q5_K hold eight 6-bit scales and eight 6-bit mins.
void KQuantScaleMin(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

absl::Status DequantizeRow(GgmlType type, const void* src, size_t src_bytes,
                           float* dst, int64_t n) {
  if (!IsDequantizeSupported(type)) {
    return absl::UnimplementedError(absl::StrCat(
        "dequantization of GGML type ", std::string(GgmlTypeName(type)),
        " (id ", static_cast<uint32_t>(type), ") is not supported"));
  }
  absl::StatusOr<uint64_t> need = RowBytes(type, n);
  if (!need.ok()) return need.status();
  if (src_bytes < *need) {
    return absl::InvalidArgumentError(
        absl::StrCat("dequantizing ", n, " elements of type ",
                     std::string(GgmlTypeName(type)), " needs ", *need,
                     " bytes but only ", src_bytes, " were given"));
  }
  const auto* b = static_cast<const uint8_t*>(src);
  const int64_t nb = n / BlockSize(type);
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(dst, b, static_cast<size_t>(n) * sizeof(float));
      break;
    case GgmlType::kF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = LoadFp16(b + 2 * i);
      break;
    case GgmlType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t v;
        std::memcpy(&v, b + 2 * i, sizeof(v));
        dst[i] = Bf16ToFp32(v);
      }
      break;
    case GgmlType::kQ4_0:
      DequantQ4_0(b, nb, dst);
      break;
    case GgmlType::kQ4_1:
      DequantQ4_1(b, nb, dst);
      break;
    case GgmlType::kQ5_0:
      DequantQ5_0(b, nb, dst);
      break;
    case GgmlType::kQ5_1:
      DequantQ5_1(b, nb, dst);
      break;
    case GgmlType::kQ8_0:
      DequantQ8_0(b, nb, dst);
      break;
    case GgmlType::kQ4_K:
      DequantQ4_K(b, nb, dst);
      break;
    case GgmlType::kQ5_K:
      DequantQ5_K(b, nb, dst);
      break;
    case GgmlType::kQ6_K:
      DequantQ6_K(b, nb, dst);
      break;
    default:
      return absl::InternalError(
          absl::StrCat("GGML type ", std::string(GgmlTypeName(type)),
                       " is marked supported but unhandled"));
  }
  return absl::OkStatus();
}

}  // namespace kvd::kernels
