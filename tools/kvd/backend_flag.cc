#include "tools/kvd/backend_flag.h"

#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_features.h"

namespace kvd::cli {

void DeclareBackendFlag(Args& a) {
  a.Flag("backend", "auto",
         "auto (the CPU, saying why; CUDA where a device can run the model "
         "once the CUDA backend has passed its device check), cpu, or cuda "
         "(GPU 0; fail rather than fall back)");
  a.Flag("tensor-parallel-size", "1",
         "split the model's attention heads and MLP over this many shards: "
         "GPUs 0..N-1 (NCCL), or with --backend cpu this process and N-1 "
         "'kvd worker' processes it starts (UCX); must divide the model's "
         "K/V heads; above 1 without --backend cpu implies --backend cuda");
  a.Switch("tensor-parallel-simulate",
           "run the --tensor-parallel-size shards one after another on GPU 0 "
           "(tests the sharded code on one GPU; no speed-up)");
}

void DeclarePrecisionFlag(Args& a) {
  a.Flag("precision", "auto",
         "auto: the faster exact mode where this runs (bf16 on CPUs with "
         "AVX512-BF16 and on the GPU, fp32 elsewhere; the start-up log "
         "says which and why); fp32 (the reference: the file's own blocks "
         "with fp32 activations and K/V) or bf16 (bf16 weights, K/V and "
         "residuals). A stored session resumes only in its own precision");
}

PrecisionChoice AutoPrecision(ops::BackendRequest backend,
                              bool cpu_has_bf16_pairs) {
  if (backend == ops::BackendRequest::kCuda) {
    return {ops::Precision::kBf16,
            "bf16 (auto: the CUDA backend computes in bf16)"};
  }
  if (cpu_has_bf16_pairs) {
    return {ops::Precision::kBf16,
            "bf16 (auto: this CPU multiplies bf16 pairs natively, "
            "AVX512-BF16)"};
  }
  return {ops::Precision::kF32,
          "fp32 (auto: this CPU has no AVX512-BF16, so bf16 products would "
          "be emulated; fp32 over the file's blocks is faster here)"};
}

absl::StatusOr<PrecisionChoice> PrecisionFromFlags(const Args& args) {
  const std::string flag = args.Get("precision");
  if (flag != "auto") {
    absl::StatusOr<ops::Precision> p = ops::ParsePrecision(flag);
    if (!p.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--precision must be auto, fp32 or bf16, not '", flag, "'"));
    }
    return PrecisionChoice{
        *p, absl::StrCat(ops::PrecisionName(*p), " (--precision)")};
  }
  absl::StatusOr<ops::BackendRequest> backend = BackendRequestFromFlag(args);
  if (!backend.ok()) return backend.status();
  absl::StatusOr<ops::TensorParallelRequest> tp = TensorParallelFromFlags(args);
  if (!tp.ok()) return tp.status();
  // Several shards without --backend cpu mean GPUs (DeclareBackendFlag).
  if (tp->degree > 1 && *backend != ops::BackendRequest::kCpu)
    backend = ops::BackendRequest::kCuda;
  return AutoPrecision(
      *backend, kernels::cpu::ActiveIsa() == kernels::cpu::Isa::kAvx512 &&
                    kernels::cpu::HasAvx512Bf16());
}

absl::StatusOr<ops::BackendRequest> BackendRequestFromFlag(const Args& args) {
  return ops::ParseBackendRequest(args.Get("backend"));
}

absl::StatusOr<ops::TensorParallelRequest> TensorParallelFromFlags(
    const Args& args) {
  absl::StatusOr<int64_t> size = args.GetInt("tensor-parallel-size");
  if (!size.ok() || *size < 1 || *size > 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tensor-parallel-size must be a whole number from 1 to 64; got '",
        args.Get("tensor-parallel-size"), "'"));
  }
  ops::TensorParallelRequest tp;
  tp.degree = static_cast<int>(*size);
  tp.simulate = args.Has("tensor-parallel-simulate");
  if (tp.simulate && tp.degree == 1) {
    return absl::InvalidArgumentError(
        "--tensor-parallel-simulate runs the shards of --tensor-parallel-size "
        "on one GPU; give a size above 1 with it");
  }
  return tp;
}

}  // namespace kvd::cli
