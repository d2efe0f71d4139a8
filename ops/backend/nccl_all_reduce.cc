#include "ops/backend/nccl_all_reduce.h"

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>

#include <algorithm>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/cuda/internal/cuda_check.h"
#include "ops/backend/internal/device_memory.h"

namespace kvd::ops {
namespace {

namespace kc = ::kvd::kernels::cuda;

// NCCL's entry points, loaded from libnccl.so.2 at run time: kvd links no
// NCCL, so it starts on machines without it (every CPU node, a single GPU),
// and only tensor parallelism across GPUs asks for the library.
struct NcclApi {
  decltype(&ncclGetErrorString) get_error_string = nullptr;
  decltype(&ncclCommInitAll) comm_init_all = nullptr;
  decltype(&ncclCommDestroy) comm_destroy = nullptr;
  decltype(&ncclAllGather) all_gather = nullptr;
  decltype(&ncclGroupStart) group_start = nullptr;
  decltype(&ncclGroupEnd) group_end = nullptr;
  std::string error;  // why it is not loaded; empty when it is
};

// Loaded once per process; never unloaded (communicators may live until
// exit).
const NcclApi& Nccl() {
  static const NcclApi* api = [] {
    auto* a = new NcclApi();
    void* lib = nullptr;
    std::string tried;
    for (const char* name : {"libnccl.so.2", "libnccl.so"}) {
      lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (lib != nullptr) break;
      const char* why = dlerror();
      absl::StrAppend(&tried, tried.empty() ? "" : "; ",
                      why != nullptr ? why : name);
    }
    if (lib == nullptr) {
      a->error = absl::StrCat(
          "NCCL could not be loaded (", tried,
          "); tensor parallelism across GPUs needs it: install NCCL 2 "
          "(NVIDIA's libnccl2 package or the nvidia-nccl wheel) and put "
          "the directory holding libnccl.so.2 on LD_LIBRARY_PATH");
      return a;
    }
    auto load = [&](auto* fn, const char* symbol) {
      *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(
          dlsym(lib, symbol));
      if (*fn == nullptr && a->error.empty()) {
        a->error = absl::StrCat("the loaded NCCL has no ", symbol,
                                "; kvd needs NCCL 2.4 or later");
      }
    };
    load(&a->get_error_string, "ncclGetErrorString");
    load(&a->comm_init_all, "ncclCommInitAll");
    load(&a->comm_destroy, "ncclCommDestroy");
    load(&a->all_gather, "ncclAllGather");
    load(&a->group_start, "ncclGroupStart");
    load(&a->group_end, "ncclGroupEnd");
    return a;
  }();
  return *api;
}

// The one ncclResult_t -> absl::Status adapter (NCCL is loaded).
absl::Status NcclStatus(ncclResult_t r, absl::string_view what) {
  if (r == ncclSuccess) return absl::OkStatus();
  const std::string msg =
      absl::StrCat(what, ": NCCL error ", static_cast<int>(r), " (",
                   Nccl().get_error_string(r), ")");
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

// Every shard gathers all shards' partials (ncclAllGather) and sums them
// itself in shard order with one fp32 add per element, exactly as
// NewSimulatedAllReduce does: the sums do not depend on NCCL's ring or tree
// order, the message size, the batch or the chunking, so TP across GPUs
// gives the simulation's bits. The price: each shard receives (S - 1) x
// count floats instead of a ring all-reduce's 2 (S - 1) / S x count (the
// same at S = 2) and holds S x count floats of scratch.
class NcclAllReduce final : public AllReduce {
 public:
  NcclAllReduce(std::vector<int> devices, std::vector<ncclComm_t> comms)
      : devices_(std::move(devices)),
        comms_(std::move(comms)),
        gathered_(comms_.size(), nullptr) {}
  ~NcclAllReduce() override {
    for (size_t s = 0; s < comms_.size(); ++s) {
      if (gathered_[s] != nullptr)
        internal::FreeOnDevice(devices_[s], gathered_[s]);
      Nccl().comm_destroy(comms_[s]);
    }
  }
  int degree() const override { return static_cast<int>(comms_.size()); }
  std::vector<int> devices() const override { return devices_; }
  absl::Status Reserve(int64_t count,
                       absl::Span<void* const> streams) override {
    if (streams.size() != comms_.size() || count < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "NCCL all-reduce: need ", comms_.size(),
          " streams and count >= 0; got ", streams.size(), ", ", count));
    }
    return EnsureGathered(degree() * count, streams);
  }

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
    const int64_t n_shards = degree();
    KVD_RETURN_IF_ERROR(EnsureGathered(n_shards * count, streams));
    const NcclApi& nccl = Nccl();
    KVD_RETURN_IF_ERROR(NcclStatus(nccl.group_start(), "ncclGroupStart"));
    absl::Status st;
    for (int64_t s = 0; s < n_shards && st.ok(); ++s) {
      // Rank s's partial lands at gathered[s * count] on every shard.
      st = NcclStatus(
          nccl.all_gather(buffers[s], gathered_[s], static_cast<size_t>(count),
                          ncclFloat, comms_[s],
                          static_cast<cudaStream_t>(streams[s])),
          absl::StrCat("ncclAllGather on shard ", s, " (device ", devices_[s],
                       ")"));
    }
    // The group must be closed even after a failed enqueue.
    const absl::Status end = NcclStatus(nccl.group_end(), "ncclGroupEnd");
    KVD_RETURN_IF_ERROR(st);
    KVD_RETURN_IF_ERROR(end);
    for (int64_t s = 0; s < n_shards; ++s) {
      KVD_RETURN_IF_ERROR(kc::internal::CudaStatus(
          cudaSetDevice(devices_[s]),
          absl::StrCat("cudaSetDevice(", devices_[s], ")")));
      std::vector<const float*> partials(n_shards);
      for (int64_t k = 0; k < n_shards; ++k)
        partials[k] = gathered_[s] + k * count;
      // NewSimulatedAllReduce's adds.
      KVD_RETURN_IF_ERROR(
          AddPartialsInShardOrder(buffers[s], partials, count, streams[s]));
    }
    return absl::OkStatus();
  }

 private:
  // Scratch of at least `floats` per shard, grown (doubling) once the
  // shards' streams are done with the old one.
  absl::Status EnsureGathered(int64_t floats, absl::Span<void* const> streams) {
    if (floats <= capacity_) return absl::OkStatus();
    const int64_t n = std::max(floats, 2 * capacity_);
    // Stale until every shard has its new buffer: a failure below leaves
    // the next call to start over.
    capacity_ = 0;
    for (size_t s = 0; s < comms_.size(); ++s) {
      KVD_RETURN_IF_ERROR(kc::internal::CudaStatus(
          cudaSetDevice(devices_[s]),
          absl::StrCat("cudaSetDevice(", devices_[s], ")")));
      KVD_RETURN_IF_ERROR(kc::internal::CudaStatus(
          cudaStreamSynchronize(static_cast<cudaStream_t>(streams[s])),
          "NCCL all-reduce: waiting before growing the gather buffer"));
      if (gathered_[s] != nullptr) cudaFree(gathered_[s]);
      gathered_[s] = nullptr;
    }
    for (size_t s = 0; s < comms_.size(); ++s) {
      KVD_RETURN_IF_ERROR(kc::internal::CudaStatus(
          cudaSetDevice(devices_[s]),
          absl::StrCat("cudaSetDevice(", devices_[s], ")")));
      void* p = nullptr;
      KVD_RETURN_IF_ERROR(kc::internal::CudaStatus(
          cudaMalloc(&p, n * sizeof(float)),
          absl::StrCat("NCCL all-reduce: the gather buffer of shard ", s, " (",
                       n * sizeof(float), " bytes)")));
      gathered_[s] = static_cast<float*>(p);
    }
    capacity_ = n;
    return absl::OkStatus();
  }

  std::vector<int> devices_;
  std::vector<ncclComm_t> comms_;
  std::vector<float*> gathered_;  // per shard, on its device
  int64_t capacity_ = 0;          // floats in each gathered_[s]
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
  const NcclApi& nccl = Nccl();
  if (!nccl.error.empty()) return absl::FailedPreconditionError(nccl.error);
  std::vector<ncclComm_t> comms(devices.size(), nullptr);
  KVD_RETURN_IF_ERROR(NcclStatus(
      nccl.comm_init_all(comms.data(), static_cast<int>(devices.size()),
                         devices.data()),
      absl::StrCat("ncclCommInitAll over ", devices.size(), " devices")));
  return std::unique_ptr<AllReduce>(new NcclAllReduce(
      std::vector<int>(devices.begin(), devices.end()), std::move(comms)));
}

}  // namespace kvd::ops
