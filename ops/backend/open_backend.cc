#include "ops/backend/open_backend.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "ops/backend/choose_backend.h"
#include "ops/backend/cuda_probe.h"

namespace kvd::ops {

namespace {

// The request tensor parallelism turns it into: CUDA, unless the flags
// contradict each other.
absl::StatusOr<BackendRequest> EffectiveRequest(
    BackendRequest request, const TensorParallelRequest& tp) {
  if (tp.degree < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tensor-parallel-size must be at least 1; got ", tp.degree));
  }
  if (tp.degree == 1) return request;
  if (request == BackendRequest::kCpu) {
    if (tp.simulate) {
      return absl::InvalidArgumentError(
          "--tensor-parallel-simulate runs GPU shards on one GPU; with "
          "--backend cpu the shards are processes: drop it");
    }
    return BackendRequest::kCpu;  // shard worker processes
  }
  return BackendRequest::kCuda;
}

// FAILED_PRECONDITION, saying what to do, where no CUDA device is usable or
// (unless simulating) there are fewer devices than shards.
absl::Status TensorParallelDeviceCheck(const TensorParallelRequest& tp) {
  const DeviceProbe probe = ProbeCudaDevices();
  if (probe.device_count == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--tensor-parallel-size ", tp.degree,
        " runs on GPUs, and no CUDA device can be used here (", probe.detail,
        "); run on a GPU machine, or drop --tensor-parallel-size to run on "
        "the CPU"));
  }
  if (!tp.simulate && probe.device_count < tp.degree) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--tensor-parallel-size ", tp.degree, " needs ", tp.degree,
        " CUDA devices; this machine has ", probe.device_count,
        " (pass --tensor-parallel-simulate to run every shard on GPU 0, for "
        "testing)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<OpenedBackend> OpenTensorParallel(
    const Model& model, const TensorParallelRequest& tp) {
  KVD_RETURN_IF_ERROR(TensorParallelDeviceCheck(tp));
  const std::string flag =
      absl::StrCat("--tensor-parallel-size ", tp.degree, ": ");
  absl::StatusOr<BackendChoice> choice =
      ChooseBackend(BackendRequest::kCuda, model.config(), model.precision());
  if (!choice.ok()) {
    return absl::Status(choice.status().code(),
                        absl::StrCat(flag, choice.status().message()));
  }
  absl::StatusOr<std::unique_ptr<ModelBackend>> gpu =
      MakeTpCudaBackend(model, tp);
  if (!gpu.ok()) {
    return absl::Status(gpu.status().code(),
                        absl::StrCat(flag, gpu.status().message()));
  }
  OpenedBackend opened;
  opened.kind = Backend::kCuda;
  opened.owned = *std::move(gpu);
  opened.backend = opened.owned.get();
  opened.notice =
      tp.simulate ? absl::StrCat("kvd: ", tp.degree,
                                 " tensor-parallel shards simulated on GPU 0 "
                                 "(--tensor-parallel-simulate: for testing, no "
                                 "speed-up)")
                  : absl::StrCat("kvd: tensor parallel over GPUs 0..",
                                 tp.degree - 1, " (NCCL)");
  return opened;
}

}  // namespace

absl::Status PrecheckBackend(BackendRequest request,
                             const TensorParallelRequest& tp) {
  KVD_ASSIGN_OR_RETURN(const BackendRequest effective,
                       EffectiveRequest(request, tp));
  if (tp.degree > 1 && effective == BackendRequest::kCpu)
    return absl::OkStatus();
  if (tp.degree > 1) return TensorParallelDeviceCheck(tp);
  if (effective != BackendRequest::kCuda) return absl::OkStatus();
  // Any model: only the device is in question here.
  return SelectBackend(effective, ProbeCudaDevices(),
                       CudaModelSupport{true, ""})
      .status();
}

absl::StatusOr<OpenedBackend> OpenBackend(BackendRequest request,
                                          const Model& model,
                                          const TensorParallelRequest& tp) {
  KVD_ASSIGN_OR_RETURN(const BackendRequest effective,
                       EffectiveRequest(request, tp));
  if (tp.degree > 1 && effective == BackendRequest::kCpu) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--tensor-parallel-size ", tp.degree,
        " --backend cpu runs its shards as worker processes, which only a "
        "node starts ('kvd serve', 'kvd chat'); drop --tensor-parallel-size "
        "here"));
  }
  if (tp.degree > 1) return OpenTensorParallel(model, tp);
  request = effective;
  KVD_ASSIGN_OR_RETURN(
      const BackendChoice choice,
      ChooseBackend(request, model.config(), model.precision()));
  OpenedBackend opened;
  opened.backend = &model;
  opened.notice = choice.notice;
  if (choice.backend == Backend::kCpu) return opened;
  absl::StatusOr<std::unique_ptr<ModelBackend>> gpu = MakeCudaBackend(model);
  if (!gpu.ok()) {
    if (request == BackendRequest::kCuda) {
      return absl::Status(
          gpu.status().code(),
          absl::StrCat("--backend cuda: ", gpu.status().message(),
                       "; pass --backend auto or cpu to run on the CPU"));
    }
    opened.notice =
        absl::StrCat("kvd: the CUDA backend did not start (",
                     gpu.status().message(), "); using the CPU backend");
    return opened;
  }
  opened.kind = Backend::kCuda;
  opened.owned = *std::move(gpu);
  opened.backend = opened.owned.get();
  return opened;
}

}  // namespace kvd::ops
