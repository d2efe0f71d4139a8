#include "ops/backend/all_reduce.h"

#include <cuda_runtime.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/cuda/internal/cuda_check.h"
#include "kernels/cuda/model_ops.h"

namespace kvd::ops {
namespace {

namespace kc = ::kvd::kernels::cuda;

absl::Status CheckSpans(const char* who, int degree, size_t buffers,
                        size_t streams, int64_t count) {
  if (static_cast<int>(buffers) != degree ||
      static_cast<int>(streams) != degree || count < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": need ", degree, " buffers and ", degree,
                     " streams and count >= 0; got ", buffers, " buffers, ",
                     streams, " streams, count ", count));
  }
  return absl::OkStatus();
}

class SimulatedAllReduce final : public AllReduce {
 public:
  explicit SimulatedAllReduce(int degree) : degree_(degree) {}
  int degree() const override { return degree_; }

  absl::Status SumInPlace(absl::Span<float* const> buffers, int64_t count,
                          absl::Span<void* const> streams) override {
    KVD_RETURN_IF_ERROR(CheckSpans("simulated all-reduce", degree_,
                                   buffers.size(), streams.size(), count));
    for (int s = 1; s < degree_; ++s) {
      if (streams[s] != streams[0]) {
        return absl::InvalidArgumentError(absl::StrCat(
            "simulated all-reduce: shard ", s,
            " is on another stream; the simulation needs every shard on one "
            "stream (use NewNcclAllReduce for shards on several GPUs)"));
      }
    }
    if (degree_ == 1 || count == 0) return absl::OkStatus();
    const std::vector<const float*> partials(buffers.begin(), buffers.end());
    KVD_RETURN_IF_ERROR(
        AddPartialsInShardOrder(buffers[0], partials, count, streams[0]));
    for (int s = 1; s < degree_; ++s) {
      KVD_RETURN_IF_ERROR(kc::internal::CudaStatus(
          cudaMemcpyAsync(buffers[s], buffers[0], count * sizeof(float),
                          cudaMemcpyDeviceToDevice,
                          static_cast<cudaStream_t>(streams[0])),
          "simulated all-reduce: copying the sum to the other shards"));
    }
    return absl::OkStatus();
  }

 private:
  int degree_;
};

}  // namespace

absl::Status AddPartialsInShardOrder(float* dst,
                                     absl::Span<const float* const> partials,
                                     int64_t count, void* stream) {
  if (partials.empty() || count <= 0) return absl::OkStatus();
  if (dst != partials[0]) {
    KVD_RETURN_IF_ERROR(kc::internal::CudaStatus(
        cudaMemcpyAsync(dst, partials[0], count * sizeof(float),
                        cudaMemcpyDeviceToDevice,
                        static_cast<cudaStream_t>(stream)),
        "all-reduce: shard 0's partial"));
  }
  // One row of `count` values: AddRows is one fp32 add per element.
  for (size_t s = 1; s < partials.size(); ++s) {
    KVD_RETURN_IF_ERROR(kc::AddRows(dst, count, partials[s], count, 1, count,
                                    /*round_bf16=*/false, stream));
  }
  return absl::OkStatus();
}

std::unique_ptr<AllReduce> NewSimulatedAllReduce(int degree) {
  return std::make_unique<SimulatedAllReduce>(degree < 1 ? 1 : degree);
}

}  // namespace kvd::ops
