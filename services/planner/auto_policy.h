// `--policy auto`: the checkpoint policy a node gives new sessions, chosen by
// the rebuild planner (planner.h) from this machine's measured rates.
//
// At start-up the node measures, once, what the planner needs (calibration.h:
// the model's GEMM, attention and own rebuild paths at its thread count, and
// the read bandwidth of the directory its sessions live in), caches the
// figures in a calibration file so later starts only read it, and plans a
// session of `tokens` tokens read back from that directory: the policy with
// the smallest modelled resume time within the byte budget. Both models kvd
// ships are GQA, so their K/V rows are smaller than a residual row and need
// no compute: `kv` wins there; kv-direct wins where K/V is larger (multi-head
// attention) and reading is slow, stride:k or tokens under a tight budget.
//
//   AutoPolicyOptions o{.calibration_path = dir + "/calibration.json",
//                       .storage_dir = dir};
//   KVD_ASSIGN_OR_RETURN(AutoPolicy chosen, ChooseCheckpointPolicy(*model, o));
//   options.engine.policy = chosen.policy;
//   std::cerr << chosen.summary << "\n";
//
// Thread-safety: measures on the model's thread pool; call before serving.
#ifndef KVD_SERVICES_PLANNER_AUTO_POLICY_H_
#define KVD_SERVICES_PLANNER_AUTO_POLICY_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "ops/kvdirect/checkpoint_policy.h"
#include "ops/model/model.h"
#include "services/planner/planner.h"

namespace kvd::planner {

struct AutoPolicyOptions {
  // Read if present, extended with what was missing and written back;
  // empty: measure every time, keep nothing.
  std::string calibration_path;
  // Where checkpoints are read from on a resume: its read bandwidth is
  // measured (a 64 MiB file, written and dropped from the page cache).
  std::string storage_dir;
  // Session length planned for (clamped to the model's context).
  int64_t tokens = 4096;
  // Largest bytes at rest per token (planner.h); 0: no limit.
  int64_t budget_bytes_per_token = 0;
  // False where the backend cannot copy K/V rows (ModelBackend::KvRowAccess):
  // kv is then not a candidate.
  bool kv_candidate = true;
};

struct AutoPolicy {
  ops::CheckpointPolicy policy;
  RebuildPlan plan;
  double read_bytes_per_s = 0;
  bool measured_now = false;  // false: every figure came from the file
  // One line for the log: the choice and every candidate's estimate.
  std::string summary;
};

// What the error says if measuring or planning fails (an unwritable
// directory, a calibration file of another format): the caller may fall
// back to kv-direct, saying so.
absl::StatusOr<AutoPolicy> ChooseCheckpointPolicy(
    const ops::Model& model, const AutoPolicyOptions& options);

}  // namespace kvd::planner

#endif  // KVD_SERVICES_PLANNER_AUTO_POLICY_H_
