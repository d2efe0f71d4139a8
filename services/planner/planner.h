// The rebuild planner (DESIGN.md section 4): for a session of T tokens on a
// storage tier, estimates how long rebuilding its K/V takes under each
// checkpoint policy and picks the fastest that fits the tier's byte budget.
//
// The cost model, per policy (docs/PLANNER.md has the derivation):
//   bytes at rest  token ids + the policy's rows, counting for a sliding-window
//                  layer only the positions its window can still see;
//   bytes read     = bytes at rest (a rebuild of every layer reads the lot);
//   FLOPs          counted from the config: kv reads and computes nothing,
//                  kv-direct runs one K/V projection per layer, stride:k runs
//                  each segment's layers in full from its checkpoint but the
//                  last, whose K/V projection alone is needed (RebuildKv),
//                  tokens runs every layer (a re-prefill);
//   time           max(read, compute) when reading and computing are
//                  pipelined (by layer or chunk), read + compute when not,
//                  with read = bytes / tier bandwidth and compute from the
//                  model's measured rebuild paths when the rates carry them
//                  (recomputed rows x RecomputeKv's seconds per row; full
//                  layers' rows x seconds per row + attention pairs x seconds
//                  per pair, timed with ForwardLayers), else FLOPs / measured
//                  GEMM and attention rates (calibration.h).
// The FLOP fallback leaves out elementwise work (norms, RoPE, activations);
// neither counts the pipeline's fill (the first chunk's read).
//
//   PlanRequest request{.config = model.config(), .precision = precision,
//                       .tokens = 4096, .read_bytes_per_s = 2e9,
//                       .rates = rates};
//   KVD_ASSIGN_OR_RETURN(RebuildPlan plan, PlanRebuild(request));
//   const PolicyEstimate& best = plan.estimates[plan.chosen];
//
// Thread-safety: pure functions on values.
#ifndef KVD_SERVICES_PLANNER_PLANNER_H_
#define KVD_SERVICES_PLANNER_PLANNER_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "ops/kvdirect/checkpoint_policy.h"
#include "ops/model/model_config.h"

namespace kvd::planner {

// Measured compute rates, FLOP/s (a multiply-add counts 2), at the row count
// the rebuild runs its GEMMs with (calibration.h measures them).
struct RebuildRates {
  double kv_projection_flops_per_s = 0;  // GEMM at the K/V projection's shape
  double layer_gemm_flops_per_s = 0;     // GEMM at the other projections'
  double attention_flops_per_s = 0;      // causal attention (score + value)
  // Measured on the model's own paths (calibration.h ModelPathRate); 0: not
  // measured, count FLOPs instead. Seconds per K/V row recomputed from a
  // residual (Model::RecomputeKv, one layer), and one full layer's seconds
  // per row and per (query, visible key) pair (Model::ForwardLayers).
  double recompute_s_per_row = 0;
  double layer_s_per_row = 0;
  double layer_s_per_attention_pair = 0;
};

struct PlanRequest {
  ops::ModelConfig config;
  ops::Precision precision = ops::Precision::kBf16;
  int64_t tokens = 0;  // session length T, >= 1
  // Sustained read bandwidth of the tier holding the checkpoint, bytes/s.
  double read_bytes_per_s = 0;
  RebuildRates rates;
  // Largest bytes at rest per token the tier may hold for this session (the
  // session's total / T); 0: no limit.
  int64_t budget_bytes_per_token = 0;
  // True: reading a layer's (or chunk's) checkpoint overlaps the compute of
  // the previous one. False: the whole checkpoint is read first.
  bool overlap_read_and_compute = true;
  // Policies to consider; empty: DefaultCandidates(config.n_layers).
  std::vector<ops::CheckpointPolicy> candidates;
};

struct PolicyEstimate {
  ops::CheckpointPolicy policy;
  int64_t bytes_at_rest = 0;   // the whole session, token ids included
  double bytes_per_token = 0;  // bytes_at_rest / T
  int64_t bytes_read = 0;
  double gemm_flops = 0;       // all projections and MLPs run
  double attention_flops = 0;  // 4 x q_dim per (query, visible key) pair
  double read_s = 0;
  double compute_s = 0;
  double estimate_s = 0;  // the modelled rebuild time
  // Whether compute_s came from the measured path costs (else FLOP counts).
  bool measured_compute = false;
  bool fits_budget = true;
  double flops() const { return gemm_flops + attention_flops; }
};

struct RebuildPlan {
  std::vector<PolicyEstimate> estimates;  // in candidate order
  int chosen = -1;  // index of the fastest within budget (ties: fewest bytes)
};

// kv, kv-direct, stride:k for k in {2, 3, 4, 6, 8, 12} below n_layers, tokens.
std::vector<ops::CheckpointPolicy> DefaultCandidates(int64_t n_layers);

// The cost of one policy (fits_budget filled in against the request's
// budget). INVALID_ARGUMENT for a bad request (T < 1, T beyond the context,
// a non-positive or non-finite bandwidth or rate, a negative or non-finite
// measured cost, a config without layers).
absl::StatusOr<PolicyEstimate> EstimateRebuild(
    const PlanRequest& request, const ops::CheckpointPolicy& policy);

// Every candidate's estimate and the choice. RESOURCE_EXHAUSTED if no
// candidate fits the budget (the message names the smallest one).
absl::StatusOr<RebuildPlan> PlanRebuild(const PlanRequest& request);

}  // namespace kvd::planner

#endif  // KVD_SERVICES_PLANNER_PLANNER_H_
