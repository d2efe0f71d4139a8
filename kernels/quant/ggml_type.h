// GGML tensor element types: the numeric ids stored in GGUF files and the block
// geometry of each.
//
// A GGML "type" packs `BlockSize()` consecutive elements of a row into
// `BlockBytes()` bytes (1 element for F32/F16/BF16, 32 for Q4_0..Q8_1, 256 for
// the K-quants). Every row length must be a multiple of the block size. The ids
// are GGML's (ggml.h `enum ggml_type`); ids GGML retired (4, 5, 31-33, 36-38)
// are not types here.
//
// Thread-safety: all functions are pure and thread-safe.
//
//   KVD_ASSIGN_OR_RETURN(GgmlType type, GgmlTypeFromId(raw_id));
//   KVD_ASSIGN_OR_RETURN(uint64_t bytes, RowBytes(type, row_length));
//   if (!IsDequantizeSupported(type)) return absl::UnimplementedError(...);
#ifndef KVD_KERNELS_QUANT_GGML_TYPE_H_
#define KVD_KERNELS_QUANT_GGML_TYPE_H_

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"

namespace kvd::kernels {

enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kIQ1_M = 29,
  kBF16 = 30,
  kTQ1_0 = 34,
  kTQ2_0 = 35,
  kMXFP4 = 39,
  kNVFP4 = 40,
  kQ1_0 = 41,
};

// True if `id` names a GGML type known to kvd (its geometry is known), whether
// or not kvd can dequantize it.
bool IsKnownGgmlType(uint32_t id);

// Converts a raw id read from a file; INVALID_ARGUMENT naming the id if it is
// unknown.
absl::StatusOr<GgmlType> GgmlTypeFromId(uint32_t id);

// GGML's name for the type ("F32", "Q4_K", ...); "unknown" for ids that are not
// known types.
std::string_view GgmlTypeName(GgmlType type);

// Looks a type up by GGML's name (case-sensitive, e.g. "Q8_0");
// INVALID_ARGUMENT if unknown.
absl::StatusOr<GgmlType> GgmlTypeFromName(std::string_view name);

// Elements per block (1, 32, 64, 128 or 256); 0 for an unknown type.
int64_t BlockSize(GgmlType type);

// Bytes per block; 0 for an unknown type.
int64_t BlockBytes(GgmlType type);

// Bytes taken by `n_elements` consecutive elements (a row). INVALID_ARGUMENT if
// the type is unknown, `n_elements` is negative or not a multiple of the block
// size, or the size would overflow uint64.
absl::StatusOr<uint64_t> RowBytes(GgmlType type, int64_t n_elements);

// True for the types DequantizeRow() accepts: F32, F16, BF16, Q4_0, Q4_1, Q5_0,
// Q5_1, Q8_0, Q4_K, Q5_K, Q6_K.
bool IsDequantizeSupported(GgmlType type);

}  // namespace kvd::kernels

#endif  // KVD_KERNELS_QUANT_GGML_TYPE_H_
