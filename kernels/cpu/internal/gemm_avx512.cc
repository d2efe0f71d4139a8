// AVX-512 implementation of the canonical GEMM: the 16 lanes are one register
// (avx512_ops.h). Compiled with AVX-512 flags; only called after cpu_features
// confirms the machine supports them.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/internal/avx512_ops.h"
#include "kernels/cpu/internal/gemm_blocks.h"
#include "kernels/cpu/internal/gemm_isa.h"
#include "kernels/cpu/internal/gemm_tile.h"

namespace kvd::kernels::cpu::internal {

void GemmF32Avx512(const GemmArgs& a, int64_t n_begin, int64_t n_end) {
  GemmRange<Avx512Ops, float, 4, 4, 1>(a, n_begin, n_end);
}

void GemmBf16Avx512(const GemmArgs& a, int64_t n_begin, int64_t n_end) {
  GemmRange<Avx512Ops, uint16_t, 4, 4, 1>(a, n_begin, n_end);
}

bool GemmBlocksAvx512(const GemmArgs& a, int64_t n_begin, int64_t n_end) {
  return BlocksRange<Avx512Ops, 4, 4, 1, 2>(a, n_begin, n_end);
}

bool DecodeBlocksBf16Avx512(const GemmArgs& a, int64_t n0, int64_t rows,
                            uint16_t* out) {
  return DecodeBlocksBf16<Avx512Ops>(a, n0, rows, out);
}

}  // namespace kvd::kernels::cpu::internal
