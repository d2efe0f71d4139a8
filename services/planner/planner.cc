#include "services/planner/planner.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace kvd::planner {

using ops::BytesPerToken;
using ops::CheckpointPolicy;
using ops::ComputeBytesPerToken;
using ops::ModelConfig;

namespace {

using Kind = CheckpointPolicy::Kind;

bool PositiveFinite(double x) { return std::isfinite(x) && x > 0; }

int64_t Window(const ModelConfig& c, int64_t l) {
  return c.layers[l].sliding_window;
}

// Positions of layer l whose K/V decoding still reads: all T for a global
// layer, the last W for a sliding-window one.
int64_t KvRows(const ModelConfig& c, int64_t l, int64_t t) {
  return Window(c, l) == 0 ? t : std::min(t, Window(c, l));
}

// Query/key pairs of causal attention for the last `rows` of T positions:
// query p sees min(p + 1, W) keys (all p + 1 if W == 0).
double AttentionPairs(int64_t t, int64_t rows, int64_t window) {
  double pairs = 0;
  for (int64_t p = t - rows; p < t; ++p) {
    pairs += window == 0 ? p + 1 : std::min(p + 1, window);
  }
  return pairs;
}

struct Flops {
  double kv_projection = 0;  // at the K/V projection's shape
  double kv_only = 0;        // the part of it outside full layers
  double other_gemm = 0;     // Q, O and the MLP
  double attention = 0;
  // The same work as rows and pairs, for the measured path costs.
  double recompute_rows = 0;  // K/V projection alone (RecomputeKv)
  double layer_rows = 0;      // full layers
  double layer_pairs = 0;     // their attention's (query, key) pairs
};

// K/V projection of `rows` tokens at one layer: two GEMMs d_model -> kv_dim.
void AddKvProjectionFlops(const ModelConfig& c, int64_t rows, Flops* f) {
  f->kv_projection += 2.0 * rows * c.d_model * 2 * c.kv_dim();
}

// A K/V-only recompute of `rows` tokens at one layer.
void AddKvOnly(const ModelConfig& c, int64_t rows, Flops* f) {
  const double before = f->kv_projection;
  AddKvProjectionFlops(c, rows, f);
  f->kv_only += f->kv_projection - before;
  f->recompute_rows += rows;
}

// Layer l in full for the last `rows` of T positions: Q/K/V/O projections,
// the gated MLP (three d_model x d_ff GEMMs) and causal attention.
void AddFullLayer(const ModelConfig& c, int64_t l, int64_t t, int64_t rows,
                  Flops* f) {
  AddKvProjectionFlops(c, rows, f);
  f->other_gemm += 2.0 * rows * c.d_model * c.q_dim() * 2;  // Q and O
  f->other_gemm += 2.0 * rows * c.d_model * c.d_ff * 3;     // gate, up, down
  const double pairs = AttentionPairs(t, rows, Window(c, l));
  f->attention += 4.0 * c.q_dim() * pairs;
  f->layer_rows += rows;
  f->layer_pairs += pairs;
}

// Runs layers [s, e) over the last `rows` positions; with `kv_only_tail` the
// last one only projects its K/V.
void AddSegment(const ModelConfig& c, int64_t s, int64_t e, int64_t t,
                int64_t rows, bool kv_only_tail, Flops* f) {
  for (int64_t l = s; l < e; ++l) {
    if (kv_only_tail && l == e - 1) {
      AddKvOnly(c, rows, f);
    } else {
      AddFullLayer(c, l, t, rows, f);
    }
  }
}

bool NonNegativeFinite(double x) { return std::isfinite(x) && x >= 0; }

// Compute seconds: the measured path costs where the rates carry them, else
// FLOPs over the measured GEMM and attention rates. Sets *measured when every
// part of the work had a measured cost.
double ComputeSeconds(const RebuildRates& r, const Flops& f, bool* measured) {
  const bool recompute = r.recompute_s_per_row > 0;
  const bool layer = r.layer_s_per_row > 0 || r.layer_s_per_attention_pair > 0;
  const double kv_full_flops = f.kv_projection - f.kv_only;
  const double kv_only_s = recompute ? f.recompute_rows * r.recompute_s_per_row
                                     : f.kv_only / r.kv_projection_flops_per_s;
  const double full_s = layer ? f.layer_rows * r.layer_s_per_row +
                                    f.layer_pairs * r.layer_s_per_attention_pair
                              : kv_full_flops / r.kv_projection_flops_per_s +
                                    f.other_gemm / r.layer_gemm_flops_per_s +
                                    f.attention / r.attention_flops_per_s;
  *measured = (f.recompute_rows == 0 || recompute) &&
              (f.layer_rows == 0 || layer) &&
              (f.recompute_rows + f.layer_rows > 0);
  return kv_only_s + full_s;
}

absl::Status CheckRequest(const PlanRequest& r) {
  const ModelConfig& c = r.config;
  if (c.n_layers < 1 || static_cast<int64_t>(c.layers.size()) != c.n_layers ||
      c.d_model < 1 || c.kv_dim() < 1 || c.q_dim() < 1 || c.d_ff < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "planner: model '", c.name, "' has no usable shape (", c.n_layers,
        " layers, ", c.layers.size(), " layer configs)"));
  }
  if (r.tokens < 1 || (c.context_length > 0 && r.tokens > c.context_length)) {
    return absl::InvalidArgumentError(
        absl::StrCat("planner: ", r.tokens,
                     " tokens is not a session length "
                     "for model '",
                     c.name, "' (1 to ", c.context_length, ")"));
  }
  if (!PositiveFinite(r.read_bytes_per_s)) {
    return absl::InvalidArgumentError(
        absl::StrCat("planner: read bandwidth ", r.read_bytes_per_s,
                     " bytes/s must be positive and finite"));
  }
  if (!PositiveFinite(r.rates.kv_projection_flops_per_s) ||
      !PositiveFinite(r.rates.layer_gemm_flops_per_s) ||
      !PositiveFinite(r.rates.attention_flops_per_s)) {
    return absl::InvalidArgumentError(
        "planner: every compute rate (K/V projection, layer GEMM, attention) "
        "must be a positive, finite FLOP/s figure; calibrate first");
  }
  if (!NonNegativeFinite(r.rates.recompute_s_per_row) ||
      !NonNegativeFinite(r.rates.layer_s_per_row) ||
      !NonNegativeFinite(r.rates.layer_s_per_attention_pair)) {
    return absl::InvalidArgumentError(
        "planner: measured path costs (recompute and layer seconds per row, "
        "per attention pair) must be finite and >= 0 (0: not measured); "
        "delete the calibration file to re-measure");
  }
  if (r.budget_bytes_per_token < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("planner: budget ", r.budget_bytes_per_token,
                     " bytes/token must be >= 0 (0: no limit)"));
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<CheckpointPolicy> DefaultCandidates(int64_t n_layers) {
  std::vector<CheckpointPolicy> out;
  out.push_back({CheckpointPolicy::Kind::kKv, 1});
  out.push_back({CheckpointPolicy::Kind::kKvDirect, 1});
  for (int64_t k : {2, 3, 4, 6, 8, 12}) {
    if (k < n_layers) out.push_back({CheckpointPolicy::Kind::kStride, k});
  }
  out.push_back({CheckpointPolicy::Kind::kTokens, 1});
  return out;
}

absl::StatusOr<PolicyEstimate> EstimateRebuild(const PlanRequest& r,
                                               const CheckpointPolicy& policy) {
  if (absl::Status s = CheckRequest(r); !s.ok()) return s;
  if (policy.kind == Kind::kStride && policy.stride < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("planner: policy ", policy.Name(), " has no stride"));
  }
  const ModelConfig& c = r.config;
  const int64_t t = r.tokens;
  const BytesPerToken b = ComputeBytesPerToken(c, r.precision, policy);
  PolicyEstimate e;
  e.policy = policy;
  e.bytes_at_rest = b.token_id * t;
  Flops f;
  switch (policy.kind) {
    case Kind::kKv:
      for (int64_t l = 0; l < c.n_layers; ++l) {
        e.bytes_at_rest += KvRows(c, l, t) * b.kv_row_pair;
      }
      break;
    case Kind::kKvDirect:
      for (int64_t l = 0; l < c.n_layers; ++l) {
        e.bytes_at_rest += KvRows(c, l, t) * b.residual_row;
        AddKvOnly(c, KvRows(c, l, t), &f);
      }
      break;
    case Kind::kStride:
    case Kind::kTokens: {
      // tokens is one segment over every layer, fed by the embeddings.
      const int64_t k =
          policy.kind == Kind::kStride ? policy.stride : c.n_layers;
      for (int64_t s = 0; s < c.n_layers; s += k) {
        const int64_t end = std::min(s + k, c.n_layers);
        // A segment with a global layer must run every position; an all-local
        // one only the positions its windows can reach back to.
        int64_t reach = 0;
        bool global = false;
        for (int64_t l = s; l < end; ++l) {
          global |= Window(c, l) == 0;
          reach += Window(c, l);
        }
        const int64_t rows = global ? t : std::min(t, reach);
        if (policy.kind == Kind::kStride) {
          e.bytes_at_rest += rows * b.residual_row;
        }
        // A stride segment's last layer needs only its K/V (the next segment
        // starts from its own checkpoint); a re-prefill runs every layer.
        AddSegment(c, s, end, t, rows, policy.kind == Kind::kStride, &f);
      }
      break;
    }
  }
  e.bytes_per_token = static_cast<double>(e.bytes_at_rest) / t;
  e.bytes_read = e.bytes_at_rest;
  e.gemm_flops = f.kv_projection + f.other_gemm;
  e.attention_flops = f.attention;
  e.read_s = e.bytes_read / r.read_bytes_per_s;
  e.compute_s = ComputeSeconds(r.rates, f, &e.measured_compute);
  e.estimate_s = r.overlap_read_and_compute ? std::max(e.read_s, e.compute_s)
                                            : e.read_s + e.compute_s;
  e.fits_budget = r.budget_bytes_per_token == 0 ||
                  e.bytes_at_rest <= r.budget_bytes_per_token * t;
  return e;
}

absl::StatusOr<RebuildPlan> PlanRebuild(const PlanRequest& r) {
  if (absl::Status s = CheckRequest(r); !s.ok()) return s;
  const std::vector<CheckpointPolicy> candidates =
      r.candidates.empty() ? DefaultCandidates(r.config.n_layers)
                           : r.candidates;
  RebuildPlan plan;
  for (const CheckpointPolicy& p : candidates) {
    absl::StatusOr<PolicyEstimate> e = EstimateRebuild(r, p);
    if (!e.ok()) return e.status();
    plan.estimates.push_back(*e);
  }
  int smallest = -1;
  for (int i = 0; i < static_cast<int>(plan.estimates.size()); ++i) {
    const PolicyEstimate& e = plan.estimates[i];
    if (smallest < 0 ||
        e.bytes_at_rest < plan.estimates[smallest].bytes_at_rest) {
      smallest = i;
    }
    if (!e.fits_budget) continue;
    if (plan.chosen < 0) {
      plan.chosen = i;
      continue;
    }
    const PolicyEstimate& best = plan.estimates[plan.chosen];
    if (e.estimate_s < best.estimate_s ||
        (e.estimate_s == best.estimate_s &&
         e.bytes_at_rest < best.bytes_at_rest)) {
      plan.chosen = i;
    }
  }
  if (plan.chosen < 0) {
    if (smallest < 0) {
      return absl::InvalidArgumentError("planner: no candidate policies");
    }
    const PolicyEstimate& s = plan.estimates[smallest];
    return absl::ResourceExhaustedError(absl::StrCat(
        "planner: no policy fits ", r.budget_bytes_per_token,
        " bytes/token for ", r.tokens, " tokens of model '", r.config.name,
        "'; the smallest, ", s.policy.Name(), ", needs ", s.bytes_per_token,
        " bytes/token: raise the budget or use a larger tier"));
  }
  return plan;
}

}  // namespace kvd::planner
