// The backend that runs a loaded model, as `--backend auto|cpu|cuda` asks:
// the CPU model itself, or a CudaBackendModel made from its weights. Every
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
  // The CUDA backend when kind is kCuda; null for the CPU.
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
absl::StatusOr<OpenedBackend> OpenBackend(BackendRequest request,
                                          const Model& model);

// Before a model loads: FAILED_PRECONDITION when `request` is kCuda and no
// CUDA device can be used (the reason and what to do), so nobody waits for
// the weights to load to learn it. OK otherwise; OpenBackend checks the
// model itself.
absl::Status PrecheckBackend(BackendRequest request);

// CudaBackendModel::Create(model) on device 0; FAILED_PRECONDITION when kvd
// was built without the CUDA toolkit. In open_backend_{cuda,none}.cc.
absl::StatusOr<std::unique_ptr<ModelBackend>> MakeCudaBackend(
    const Model& model);

}  // namespace kvd::ops

#endif  // KVD_OPS_BACKEND_OPEN_BACKEND_H_
