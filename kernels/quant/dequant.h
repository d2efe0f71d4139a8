// GGML block dequantization to fp32: the scalar reference formats of
// ggml-quants.c.
//
// Results are exact by construction: each element is an fp16 scale (converted
// exactly to fp32) times a small integer, plus/minus an fp32 product, with the
// same operation order as GGML's reference code (and the Python `gguf` package)
// and no fused multiply-add (this file is built with -ffp-contract=off), so
// they are bit-identical to GGML's on every machine.
//
// Thread-safety: pure functions; safe to call concurrently on disjoint outputs.
//
//   const GgufTensor& t = ...;  // a tensor from a GGUF file
//   const int64_t n = t.dims[0];  // row length
//   KVD_ASSIGN_OR_RETURN(uint64_t row_bytes, RowBytes(t.type, n));
//   std::vector<float> row(n);
//   KVD_RETURN_IF_ERROR(DequantizeRow(t.type, t.data + r * row_bytes,
//                                     row_bytes, row.data(), n));
#ifndef KVD_KERNELS_QUANT_DEQUANT_H_
#define KVD_KERNELS_QUANT_DEQUANT_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/quant/ggml_type.h"

namespace kvd::kernels {

// Dequantizes `n` elements stored as `type` at `src` (which has `src_bytes`
// readable bytes, any alignment) into `dst[0, n)`.
//
// INVALID_ARGUMENT if `n` is negative or not a multiple of the type's block
// size, or if `src_bytes` < RowBytes(type, n); UNIMPLEMENTED if
// !IsDequantizeSupported(type). On error `dst` is left untouched. `src` and
// `dst` must not overlap.
absl::Status DequantizeRow(GgmlType type, const void* src, size_t src_bytes,
                           float* dst, int64_t n);

// The 6-bit scale and min of sub-block `j` (0..7) of a Q4_K or Q5_K
// super-block, unpacked from its 12 scale bytes (ggml-quants.c
// get_scale_min_k4).
void KQuantScaleMin(int j, const uint8_t* scales, uint8_t* sc, uint8_t* m);

}  // namespace kvd::kernels

#endif  // KVD_KERNELS_QUANT_DEQUANT_H_
