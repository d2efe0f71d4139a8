// The backend that runs a loaded model, as `--backend auto|cpu|cuda` and
// `--tensor-parallel-size` ask: the CPU model itself, a CudaBackendModel made
// from its weights, or a TpCudaBackendModel splitting them over GPUs. Every
// command that loads a model (kvd generate, chat, serve) opens its backend
// here, so they all fall back and explain themselves alike.
//
//   KVD_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::Load(path, o));
//   KVD_ASSIGN_OR_RETURN(OpenedBackend b, OpenBackend(request, *model));
//   if (!b.notice.empty()) std::fprintf(stderr, "%s\n", b.notice.c_str());
//   SessionEngine engine(*b.backend, ...);
//
// Thread-safety: call from one thread.
#ifndef KVD_OPS_BACKEND_OPEN_BACKEND_H_
#define KVD_OPS_BACKEND_OPEN_BACKEND_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "ops/backend/backend.h"
#include "ops/model/model.h"
#include "ops/model/model_backend.h"

namespace kvd::ops {

struct OpenedBackend {
  Backend kind = Backend::kCpu;
  // The CUDA backend (single-GPU or tensor-parallel) when kind is kCuda;
  // null for the CPU.
  std::unique_ptr<ModelBackend> owned;
  // What to run on: owned.get(), or the CPU model (which must outlive it).
  const ModelBackend* backend = nullptr;
  // One line for the user (why the CPU, or which device), or empty.
  std::string notice;
};

// kCpu: the CPU model, quietly. kAuto: CUDA when ChooseBackend picks it and
// the CUDA backend starts; otherwise the CPU, with a notice saying why.
// kCuda: CUDA, or FAILED_PRECONDITION (no device, or a model the CUDA path
// cannot run) / the CUDA backend's own error (UNIMPLEMENTED,
// RESOURCE_EXHAUSTED, INTERNAL) naming what to do.
// tp.degree > 1 asks for CUDA whatever `request` says unless it is kCpu
// (FAILED_PRECONDITION: CPU shards are worker processes, which
// services/node's runtime starts with services/worker/shard_group.h;
// INVALID_ARGUMENT with tp.simulate); on CUDA it fails rather than fall back:
// FAILED_PRECONDITION without enough devices (or NCCL), the backend's own error
// otherwise (INVALID_ARGUMENT for a degree the model does not split into,
// naming the ones it does). tp.degree < 1: INVALID_ARGUMENT.
absl::StatusOr<OpenedBackend> OpenBackend(BackendRequest request,
                                          const Model& model,
                                          const TensorParallelRequest& tp = {});

// Before a model loads: FAILED_PRECONDITION when `request` is kCuda and no
// CUDA device can be used (the reason and what to do), so nobody waits for
// the weights to load to learn it. OK otherwise; OpenBackend checks the
// model itself.
// With tp.degree > 1 as for kCuda, after OpenBackend's flag checks (OK for
// kCpu: the shard processes need no device).
absl::Status PrecheckBackend(BackendRequest request,
                             const TensorParallelRequest& tp = {});

// CudaBackendModel::Create(model) on device 0; FAILED_PRECONDITION when kvd
// was built without the CUDA toolkit. In open_backend_{cuda,none}.cc.
absl::StatusOr<std::unique_ptr<ModelBackend>> MakeCudaBackend(
    const Model& model);
// TpCudaBackendModel::Create over GPUs 0..degree-1 with NCCL (the caller
// has checked there are that many), or every shard on GPU 0 when
// tp.simulate; FAILED_PRECONDITION without NCCL, or when kvd was built
// without the CUDA toolkit. In open_backend_{cuda,none}.cc.
absl::StatusOr<std::unique_ptr<ModelBackend>> MakeTpCudaBackend(
    const Model& model, const TensorParallelRequest& tp);

}  // namespace kvd::ops

#endif  // KVD_OPS_BACKEND_OPEN_BACKEND_H_
