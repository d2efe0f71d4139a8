// GGUF dequantization on the device, for weight upload: GGML block formats to
// the bf16 the GPU backend's GEMM reads.
//
// Each element is computed exactly as kernels/quant/dequant.h computes it on
// the CPU (the same fp32 products and sums in the same order, each rounded
// separately: no fused multiply-add), then rounded to bf16 exactly as
// kernels/cpu FloatToBf16 (round to nearest even; NaN kept quiet). So the
// uploaded weights are bit-identical to the CPU backend's bf16 weights
// (ops/model/weights.h), and the GPU and CPU backends start from the same
// numbers. Blocks are read bytewise: the source needs no alignment.
//
// Types: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K (the
// CPU dequantizer's set).
//
//   // src: device copy of a GGUF tensor, rows * row_bytes bytes.
//   KVD_RETURN_IF_ERROR(DequantizeToBf16(GgmlType::kQ4_K, src, row_bytes,
//                                        rows, cols, dst, cols, stream));
//   // or straight from the mmapped file:
//   KVD_RETURN_IF_ERROR(UploadDequantizedBf16(t.type, t.data, t.size_bytes,
//                                             rows, cols, dst, cols, stream));
//
// Thread-safety: DequantizeToBf16 enqueues one kernel on `stream` and
// returns; UploadDequantizedBf16 is synchronous. Argument errors are reported
// before anything is launched or allocated.
#ifndef KVD_KERNELS_CUDA_DEQUANT_H_
#define KVD_KERNELS_CUDA_DEQUANT_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"

namespace kvd::kernels {
// Defined in kernels/quant/ggml_type.h (GGML's type ids); declared opaquely
// here so the .cu file compiles without that package's headers.
enum class GgmlType : uint32_t;
}  // namespace kvd::kernels

namespace kvd::kernels::cuda {

// True for the types DequantizeToBf16 accepts.
bool IsDeviceDequantizeSupported(GgmlType type);

// Dequantizes `rows` rows of `cols` elements: row r is the `row_bytes` bytes
// at src + r * row_bytes (device memory; row_bytes >= GGML's row size for
// `cols`), and its bf16 values go to dst[r * ld_dst, r * ld_dst + cols).
// Elements of dst past `cols` in each row are not written.
// UNIMPLEMENTED for unsupported types; INVALID_ARGUMENT if cols is not a
// multiple of the block size, row_bytes is too small, ld_dst < cols, a count
// is negative or a pointer is null; INTERNAL if the launch fails.
absl::Status DequantizeToBf16(GgmlType type, const void* src, int64_t row_bytes,
                              int64_t rows, int64_t cols, uint16_t* dst,
                              int64_t ld_dst, void* stream);

// Copies `src_bytes` host bytes (rows * GGML row size of `cols`, rows
// contiguous, as a GGUF tensor lies in its file) to a device staging buffer,
// dequantizes them into dst (device, row stride ld_dst) and waits for the
// stream. INVALID_ARGUMENT if src_bytes is not exactly that size.
absl::Status UploadDequantizedBf16(GgmlType type, const void* host_src,
                                   size_t src_bytes, int64_t rows, int64_t cols,
                                   uint16_t* dst, int64_t ld_dst, void* stream);

}  // namespace kvd::kernels::cuda

#endif  // KVD_KERNELS_CUDA_DEQUANT_H_
