#include "tools/kvd/backend_flag.h"

#include "absl/strings/str_cat.h"

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
