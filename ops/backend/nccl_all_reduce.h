// The NCCL all-reduce for tensor parallelism across GPUs (the AllReduce
// interface of all_reduce.h): one communicator per device, created together
// by ncclCommInitAll in this process, and ncclAllReduce(ncclFloat, ncclSum)
// in place on every shard's buffer within one ncclGroupStart/End. NCCL's
// summation order (ring or tree) is its own, so the sums differ in rounding
// from the single-device simulation: TP > 1 is token-identical, not
// bit-identical, to TP = 1 (kernels/cuda/README.md, "Tensor parallelism").
//
// NCCL itself is loaded at run time (dlopen of libnccl.so.2) by the first
// NewNcclAllReduce: nothing links it, so kvd starts where there is no NCCL
// and only TP across GPUs needs the library.
//
//   KVD_ASSIGN_OR_RETURN(std::unique_ptr<AllReduce> ar,
//                        NewNcclAllReduce({0, 1, 2, 3}));
//   options.devices = {0, 1, 2, 3};
//   options.all_reduce = std::move(ar);
//
// Thread-safety: as AllReduce (one SumInPlace at a time).
#ifndef KVD_OPS_BACKEND_NCCL_ALL_REDUCE_H_
#define KVD_OPS_BACKEND_NCCL_ALL_REDUCE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "ops/backend/all_reduce.h"

namespace kvd::ops {

// devices[s]: the CUDA ordinal of shard s (distinct). INVALID_ARGUMENT for
// an empty or repeated list; FAILED_PRECONDITION when NCCL cannot be loaded
// (saying what to install); if NCCL cannot set up the communicators (no
// device, a CUDA failure: INTERNAL; NCCL's system or remote errors:
// UNAVAILABLE) the status carries NCCL's message.
absl::StatusOr<std::unique_ptr<AllReduce>> NewNcclAllReduce(
    absl::Span<const int> devices);

}  // namespace kvd::ops

#endif  // KVD_OPS_BACKEND_NCCL_ALL_REDUCE_H_
