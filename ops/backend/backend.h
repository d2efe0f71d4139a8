// Which compute backend runs the model: the CPU kernels (kernels/cpu) or the
// CUDA kernels (kernels/cuda), and the one rule that picks between them.
//
// `--backend auto` (the default) takes CUDA only when a CUDA device exists AND
// the CUDA backend can serve the model; otherwise it falls back to the CPU and
// says why in one line. `--backend cuda` never falls back: it fails with the
// reason, so a deployment that expects a GPU does not silently run on the CPU.
// `--backend cpu` never probes the device at all.
//
// SelectBackend is a pure function of its inputs (tested without a GPU);
// ChooseBackend (choose_backend.h) feeds it the real device probe.
//
//   KVD_ASSIGN_OR_RETURN(BackendRequest req, ParseBackendRequest("auto"));
//   KVD_ASSIGN_OR_RETURN(BackendChoice c, SelectBackend(req, probe, support));
//   if (!c.notice.empty()) std::fprintf(stderr, "%s\n", c.notice.c_str());
//
// Thread-safety: pure functions.
#ifndef KVD_OPS_BACKEND_BACKEND_H_
#define KVD_OPS_BACKEND_BACKEND_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvd::ops {

enum class Backend { kCpu, kCuda };
enum class BackendRequest { kAuto, kCpu, kCuda };

// "cpu" or "cuda".
const char* BackendName(Backend backend);

// "auto", "cpu" or "cuda"; INVALID_ARGUMENT naming the flag otherwise.
absl::StatusOr<BackendRequest> ParseBackendRequest(absl::string_view text);

// What the device probe saw (cuda_probe.h).
struct DeviceProbe {
  // Usable CUDA devices; 0 when none (or when kvd was built without CUDA).
  int device_count = 0;
  // Name of device 0 when device_count > 0 ("NVIDIA H200").
  std::string device_name;
  // Why there is no device (the CUDA call and its error), or a short
  // description of the device(s) found. Never empty.
  std::string detail;
};

// Whether the CUDA backend can serve a given model, and if not, why.
struct CudaModelSupport {
  bool can_serve = false;
  std::string reason;  // set when !can_serve
};

// Whether `--backend auto` may pick CUDA at all. False until the CUDA
// backend has passed the device check (tools/gpu/device_check.sh:
// cuda_model_test, cuda_backend_model_test) once: no CUDA code has run on a
// GPU yet. Flip it, with the device check's date in docs/BENCHMARKS.md, once
// it has.
// `--backend cuda` is not affected.
inline constexpr bool kCudaAutoSelectVerified = false;

// The numerics version of the CUDA backend's kernels (kernels/cuda/README.md:
// GEMM k order, attention chunking, the bf16 rounding points), what
// CudaBackendModel::numerics_version reports and session checkpoints made on
// a GPU record. It is its own number space, above the CPU contract's
// (kernels/cpu/numerics_version.h), since the CPU and the GPU agree on
// tokens, not bits. The device binaries are built for sm_90a only; a build
// for several architectures whose tensor cores could round differently
// must fold the architecture in. Bump it whenever a CUDA kernel change can
// alter an output bit.
inline constexpr uint32_t kCudaNumericsVersion = 1'000'001;

// The numerics version of a tensor-parallel CUDA backend
// (tp_cuda_backend_model.h). Degree 1 runs the single-GPU kernels in their
// order: kCudaNumericsVersion. Above 1 the W_o and W_down sums are split
// over the shards and added in shard order (all_reduce.h, on one GPU or
// several alike), so each degree has its own version. Distinct for every
// degree; degree < 1 is treated as 1.
uint32_t CudaTpNumericsVersion(int degree);

// How many tensor-parallel shards to split the model over
// (--tensor-parallel-size; opened by open_backend.h).
struct TensorParallelRequest {
  // 1: one GPU (or the CPU). Above 1: a CUDA backend whose shard s runs on
  // GPU s, summed with NCCL; must divide the model's K/V heads.
  int degree = 1;
  // Every shard on GPU 0, one after another, summed in a fixed order: the
  // sharded code paths on one GPU, for testing (no speed-up).
  bool simulate = false;
};

struct BackendChoice {
  Backend backend = Backend::kCpu;
  // One line for the user when the choice is not what was asked for or needs
  // saying ("kvd: the CUDA backend cannot run gemma3 ...; using the CPU
  // backend"); empty when the CPU was asked for explicitly, and when --backend
  // auto found no CUDA device at all: a laptop without an NVIDIA driver
  // should not hear about CUDA on every command.
  std::string notice;
  // Why not CUDA, whenever the CPU was chosen under kAuto or kCuda ("no CUDA
  // device (cudaGetDeviceCount: ...)"): for --verbose and `kvd bench`.
  std::string detail;
};

// kCpu: the CPU, no notice. kAuto: CUDA if probe.device_count > 0,
// support.can_serve and auto_may_pick_cuda; otherwise the CPU with the
// reason in `detail`, and in a notice too unless there is no device at all.
// kCuda: CUDA under the same conditions; otherwise FAILED_PRECONDITION with
// the reason and what to do (run on a GPU machine, or pass --backend auto or
// cpu).
absl::StatusOr<BackendChoice> SelectBackend(
    BackendRequest request, const DeviceProbe& probe,
    const CudaModelSupport& support,
    bool auto_may_pick_cuda = kCudaAutoSelectVerified);

}  // namespace kvd::ops

#endif  // KVD_OPS_BACKEND_BACKEND_H_
