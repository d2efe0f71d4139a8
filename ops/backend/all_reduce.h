// The all-reduce a tensor-parallel forward pass (internal/tp_forward.h)
// uses to complete the partial sums of W_o and W_down: after SumInPlace,
// every shard's buffer holds the elementwise fp32 sum of all shards'
// buffers, computed as ((b0 + b1) + b2) + ... in shard order with one IEEE
// add per element. Every implementation keeps that order (it is the
// numerics contract: TP = S gives the same bits on one GPU or on S, for any
// batch or chunking; CudaTpNumericsVersion(S) names it).
//
// Implementations:
//   - NewSimulatedAllReduce (here): every shard on one device and one
//     stream; the adds in place on shard 0's buffer, the sum copied to the
//     others. At degree 1 it does nothing (TP = 1 is bit-identical to the
//     unsharded model).
//   - NewNcclAllReduce (nccl_all_reduce.h): shards on several GPUs; each
//     gathers every partial with NCCL and runs the same adds itself.
//
//   auto ar = NewSimulatedAllReduce(2);
//   float* bufs[2] = {partial0, partial1};
//   void* streams[2] = {s, s};
//   KVD_RETURN_IF_ERROR(ar->SumInPlace(bufs, n, streams));
//
// Thread-safety: one SumInPlace at a time per object (the caller's forward
// pass serialises). Buffers are device memory the caller keeps alive until
// the streams have run the reduction.
#ifndef KVD_OPS_BACKEND_ALL_REDUCE_H_
#define KVD_OPS_BACKEND_ALL_REDUCE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace kvd::ops {

class AllReduce {
 public:
  virtual ~AllReduce() = default;
  // Number of shards (buffers per call).
  virtual int degree() const = 0;
  // buffers[s]: `count` floats on shard s's device; streams[s]: the
  // cudaStream_t shard s's work is queued on. Enqueues and returns.
  // INVALID_ARGUMENT if the spans are not degree() long or count < 0.
  virtual absl::Status SumInPlace(absl::Span<float* const> buffers,
                                  int64_t count,
                                  absl::Span<void* const> streams) = 0;
  // Makes sure a later SumInPlace of up to `count` floats allocates nothing,
  // so a step can reserve before it changes any cache (RESOURCE_EXHAUSTED
  // if the scratch does not fit). `streams` as for SumInPlace.
  virtual absl::Status Reserve(int64_t count, absl::Span<void* const> streams) {
    return absl::OkStatus();
  }
  // The CUDA ordinal each rank runs on (rank s must be shard s's device),
  // or empty when the implementation does not care (the simulation).
  virtual std::vector<int> devices() const { return {}; }
};

// The contract's sum, enqueued on `stream`: dst = ((p0 + p1) + p2) + ...
// over partials[0..S) (`count` floats each, device memory on the stream's
// device), one fp32 add per element (AddRows). dst may be partials[0].
// Both all-reduces end in this, so their bits cannot drift apart.
absl::Status AddPartialsInShardOrder(float* dst,
                                     absl::Span<const float* const> partials,
                                     int64_t count, void* stream);

// All shards on one device; every streams[s] must be the same stream
// (INVALID_ARGUMENT otherwise): the order of the adds is then the queue
// order.
std::unique_ptr<AllReduce> NewSimulatedAllReduce(int degree);

}  // namespace kvd::ops

#endif  // KVD_OPS_BACKEND_ALL_REDUCE_H_
