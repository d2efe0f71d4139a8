// GGML blocks repacked for the GEMM (gemm.h, WeightType::kGgmlBlocks).
//
// A block keeps its quantized bits as the file stores them, but its scales
// are stored as the fp32 values kernels/quant's dequantizer computes from them
// (fp16 d and m widened; for the K-quants each sub-block's d * sc and
// dmin * m). The GEMM then reads a scale with one broadcast load instead of
// converting fp16 and unpacking 6-bit fields for every block and row, and the
// weights it builds are still exactly the dequantizer's. Packed blocks take
// 5-33% more bytes than the file's (Q4_1: 24 instead of 20 per 32 weights).
//
//   std::vector<uint8_t> row(PackedRowBytes(type, k));
//   KVD_RETURN_IF_ERROR(PackRow(type, file_row, file_row_bytes, k,
//   row.data())); UnpackRow(type, row.data(), k, fp32_row);  // ==
//   DequantizeRow(file_row)
//
// Layouts, per block (scales first, so they are 4-byte aligned):
//   Q4_0 {f32 d; u8 qs[16]}                       20 bytes / 32 weights
//   Q4_1 {f32 d, m; u8 qs[16]}                    24
//   Q5_0 {f32 d; u32 qh; u8 qs[16]}               24
//   Q5_1 {f32 d, m; u32 qh; u8 qs[16]}            28
//   Q8_0 {f32 d; i8 qs[32]}                       36
//   Q4_K {f32 d[8], m[8]; u8 qs[128]}             192 / 256 weights
//   Q5_K {f32 d[8], m[8]; u8 qh[32]; u8 qs[128]}  224
//   Q6_K {f32 s[16]; u8 ql[128]; u8 qh[64]}       256
//   F16  {f16 x[16]}                              32 / 16 weights (as stored)
//
// Thread-safety: pure functions.
#ifndef KVD_KERNELS_CPU_PACKED_BLOCKS_H_
#define KVD_KERNELS_CPU_PACKED_BLOCKS_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/quant/ggml_type.h"

namespace kvd::kernels::cpu {

// The GGML types the GEMM takes as packed blocks.
bool IsGemmBlockType(GgmlType type);

// Elements per packed block (16 for F16, else the GGML block size).
int64_t PackedBlockSize(GgmlType type);
int64_t PackedBlockBytes(GgmlType type);
// Bytes of `k` elements (k a multiple of PackedBlockSize).
int64_t PackedRowBytes(GgmlType type, int64_t k);

// Packs `k` elements stored as `type` at `src` (`src_bytes` readable) into
// `dst` (PackedRowBytes(type, k) bytes). INVALID_ARGUMENT if the type is not
// a GEMM block type, k is not a whole number of packed blocks, or src is
// short.
absl::Status PackRow(GgmlType type, const void* src, size_t src_bytes,
                     int64_t k, uint8_t* dst);

// The fp32 values of a packed row: bit-identical to DequantizeRow of the
// row it was packed from; with round_to_bf16, each then rounded to bf16
// (nearest-even, NaN quieted: elementwise.h's FloatToBf16) and widened.
// Preconditions as PackRow's.
void UnpackRow(GgmlType type, const uint8_t* packed, int64_t k, float* dst,
               bool round_to_bf16 = false);

}  // namespace kvd::kernels::cpu

#endif  // KVD_KERNELS_CPU_PACKED_BLOCKS_H_
