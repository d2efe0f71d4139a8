#include "ops/backend/nccl_all_reduce.h"

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>

#include <string>
#include <type_traits>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace kvd::ops {
namespace {

// NCCL's entry points, loaded from libnccl.so.2 at run time: kvd links no
// NCCL, so it starts on machines without it (every CPU node, a single GPU),
// and only tensor parallelism across GPUs asks for the library.
struct NcclApi {
  decltype(&ncclGetErrorString) get_error_string = nullptr;
  decltype(&ncclCommInitAll) comm_init_all = nullptr;
  decltype(&ncclCommDestroy) comm_destroy = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
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
          "); tensor parallelism across GPUs needs it: install NCCL 2 (the "
          "CUDA toolkit's libnccl.so.2, or the nvidia-nccl wheel) and put "
          "its directory on LD_LIBRARY_PATH");
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
    load(&a->all_reduce, "ncclAllReduce");
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

class NcclAllReduce final : public AllReduce {
 public:
  NcclAllReduce(std::vector<int> devices, std::vector<ncclComm_t> comms)
      : devices_(std::move(devices)), comms_(std::move(comms)) {}
  ~NcclAllReduce() override {
    for (ncclComm_t c : comms_) Nccl().comm_destroy(c);
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
    const NcclApi& nccl = Nccl();
    KVD_RETURN_IF_ERROR(NcclStatus(nccl.group_start(), "ncclGroupStart"));
    absl::Status st;
    for (size_t s = 0; s < comms_.size() && st.ok(); ++s) {
      st = NcclStatus(
          nccl.all_reduce(buffers[s], buffers[s], static_cast<size_t>(count),
                          ncclFloat, ncclSum, comms_[s],
                          static_cast<cudaStream_t>(streams[s])),
          absl::StrCat("ncclAllReduce on shard ", s, " (device ", devices_[s],
                       ")"));
    }
    // The group must be closed even after a failed enqueue.
    const absl::Status end = NcclStatus(nccl.group_end(), "ncclGroupEnd");
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
