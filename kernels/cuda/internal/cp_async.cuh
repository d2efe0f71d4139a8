// Thin wrappers over the sm_80+ asynchronous global->shared copy instructions.
#ifndef KVD_KERNELS_CUDA_INTERNAL_CP_ASYNC_CUH_
#define KVD_KERNELS_CUDA_INTERNAL_CP_ASYNC_CUH_

namespace kvd::kernels::cuda::internal {

// Copies 16 bytes, or zero-fills the destination when src_bytes is 0 (the
// source address must still be a valid global address).
__device__ inline void CpAsync16(void* smem, const void* gmem, int src_bytes) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s),
               "l"(gmem), "r"(src_bytes));
}

__device__ inline void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::);
}

// Waits until at most `kPending` committed groups are still in flight.
template <int kPending>
__device__ inline void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

}  // namespace kvd::kernels::cuda::internal

#endif  // KVD_KERNELS_CUDA_INTERNAL_CP_ASYNC_CUH_
