// The all-reduce for tensor parallelism across GPUs (the AllReduce
// interface of all_reduce.h): one NCCL communicator per device, created
// together by ncclCommInitAll in this process. Each shard gathers every
// shard's partial (ncclAllGather, in one ncclGroupStart/End) and sums them
// itself in shard order, ((b0 + b1) + b2) + ..., one fp32 add per element:
// NewSimulatedAllReduce's sums, bit for bit, whatever NCCL's algorithm,
// the message size, the batch or the chunking. So TP = S across S GPUs
// gives the single-GPU simulation's bits (one numerics version per degree,
// CudaTpNumericsVersion), and TP > 1 stays token-identical, not
// bit-identical, to TP = 1 (kernels/cuda/README.md, "Tensor parallelism").
// Cost: each shard receives (S - 1) x count floats (a ring all-reduce:
// 2 (S - 1) / S x count; the same at S = 2) and keeps S x count floats of
// gather scratch, grown on demand.
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
