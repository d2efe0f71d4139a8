#include "ops/backend/nccl_all_reduce.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace kvd::ops {
namespace {

// The one ncclResult_t -> absl::Status adapter.
absl::Status NcclStatus(ncclResult_t r, absl::string_view what) {
  if (r == ncclSuccess) return absl::OkStatus();
  const std::string msg =
      absl::StrCat(what, ": NCCL error ", static_cast<int>(r), " (",
                   ncclGetErrorString(r), ")");
  switch (r) {
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return absl::InvalidArgumentError(msg);
    case ncclSystemError:
    case ncclRemoteError:
      return absl::UnavailableError(msg);
    default:
      return absl::InternalError(msg);
  }
}

class NcclAllReduce final : public AllReduce {
 public:
  NcclAllReduce(std::vector<int> devices, std::vector<ncclComm_t> comms)
      : devices_(std::move(devices)), comms_(std::move(comms)) {}
  ~NcclAllReduce() override {
    for (ncclComm_t c : comms_) ncclCommDestroy(c);
  }
  int degree() const override { return static_cast<int>(comms_.size()); }

  absl::Status SumInPlace(absl::Span<float* const> buffers, int64_t count,
                          absl::Span<void* const> streams) override {
    if (buffers.size() != comms_.size() || streams.size() != comms_.size() ||
        count < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("NCCL all-reduce: need ", comms_.size(),
                       " buffers and streams and "
                       "count >= 0; got ",
                       buffers.size(), ", ", streams.size(), ", ", count));
    }
    if (count == 0) return absl::OkStatus();
    KVD_RETURN_IF_ERROR(NcclStatus(ncclGroupStart(), "ncclGroupStart"));
    absl::Status st;
    for (size_t s = 0; s < comms_.size() && st.ok(); ++s) {
      st = NcclStatus(
          ncclAllReduce(buffers[s], buffers[s], static_cast<size_t>(count),
                        ncclFloat, ncclSum, comms_[s],
                        static_cast<cudaStream_t>(streams[s])),
          absl::StrCat("ncclAllReduce on shard ", s, " (device ", devices_[s],
                       ")"));
    }
    // The group must be closed even after a failed enqueue.
    const absl::Status end = NcclStatus(ncclGroupEnd(), "ncclGroupEnd");
    return st.ok() ? end : st;
  }

 private:
  std::vector<int> devices_;
  std::vector<ncclComm_t> comms_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<AllReduce>> NewNcclAllReduce(
    absl::Span<const int> devices) {
  absl::flat_hash_set<int> seen(devices.begin(), devices.end());
  if (devices.empty() || seen.size() != devices.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NCCL all-reduce: need one distinct CUDA device per shard; got ",
        devices.size(), " devices, ", seen.size(), " distinct"));
  }
  std::vector<ncclComm_t> comms(devices.size(), nullptr);
  KVD_RETURN_IF_ERROR(NcclStatus(
      ncclCommInitAll(comms.data(), static_cast<int>(devices.size()),
                      devices.data()),
      absl::StrCat("ncclCommInitAll over ", devices.size(), " devices")));
  return std::unique_ptr<AllReduce>(new NcclAllReduce(
      std::vector<int>(devices.begin(), devices.end()), std::move(comms)));
}

}  // namespace kvd::ops
