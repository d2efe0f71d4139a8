#include "ops/backend/cuda_backend_model.h"
#include "ops/backend/nccl_all_reduce.h"
#include "ops/backend/open_backend.h"
#include "ops/backend/tp_cuda_backend_model.h"

namespace kvd::ops {

absl::StatusOr<std::unique_ptr<ModelBackend>> MakeCudaBackend(
    const Model& model) {
  absl::StatusOr<std::unique_ptr<CudaBackendModel>> gpu =
      CudaBackendModel::Create(model);
  if (!gpu.ok()) return gpu.status();
  return std::unique_ptr<ModelBackend>(std::move(*gpu));
}

absl::StatusOr<std::unique_ptr<ModelBackend>> MakeTpCudaBackend(
    const Model& model, const TensorParallelRequest& tp) {
  TpCudaBackendOptions o;
  o.degree = tp.degree;
  if (!tp.simulate) {
    // OpenBackend has checked there are enough devices.
    for (int s = 0; s < tp.degree; ++s) o.devices.push_back(s);
    absl::StatusOr<std::unique_ptr<AllReduce>> nccl =
        NewNcclAllReduce(o.devices);
    if (!nccl.ok()) return nccl.status();
    o.all_reduce = std::move(*nccl);
  }
  absl::StatusOr<std::unique_ptr<TpCudaBackendModel>> gpu =
      TpCudaBackendModel::Create(model, o);
  if (!gpu.ok()) return gpu.status();
  return std::unique_ptr<ModelBackend>(std::move(*gpu));
}

}  // namespace kvd::ops
