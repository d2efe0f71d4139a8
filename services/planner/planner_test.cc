// The planner's cost model against figures worked out by hand from the
// formulas in planner.h / docs/PLANNER.md (the arithmetic is written next to
// each expectation), plus its choice rule and the byte accounting's agreement
// with ComputeBytesPerToken.
//
// Toy shape used throughout: 4 layers, d_model 64, 4 query heads of 16
// (q_dim 64), d_ff 128, fp32, T = 10 tokens. Per token and layer:
//   residual row      64 x 4 B                     = 256 B
//   K/V projection    2 x d_model x 2 x kv_dim FLOPs
//   Q and O           2 x 64 x 64 x 2              = 16384 FLOPs
//   MLP (3 GEMMs)     2 x 64 x 128 x 3             = 49152 FLOPs
//   attention         4 x q_dim = 256 FLOPs per (query, visible key) pair
// Rates: K/V projection 1e9, other GEMMs 2e9, attention 0.5e9 FLOP/s.
#include "services/planner/planner.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"

namespace kvd::planner {
namespace {

using ops::BytesPerToken;
using ops::CheckpointPolicy;
using ops::ComputeBytesPerToken;
using ops::LayerConfig;
using ops::ModelConfig;
using ops::ParseCheckpointPolicy;
using ops::Precision;

ModelConfig Toy(int64_t n_kv_heads) {
  ModelConfig c;
  c.name = "toy";
  c.n_layers = 4;
  c.d_model = 64;
  c.n_heads = 4;
  c.n_kv_heads = n_kv_heads;
  c.head_dim = 16;
  c.d_ff = 128;
  c.context_length = 100000;
  c.layers.resize(4);
  return c;
}

PlanRequest Request(const ModelConfig& c, double bandwidth) {
  PlanRequest r;
  r.config = c;
  r.precision = Precision::kF32;
  r.tokens = 10;
  r.read_bytes_per_s = bandwidth;
  r.rates = {1e9, 2e9, 0.5e9};
  return r;
}

CheckpointPolicy P(const char* name) { return *ParseCheckpointPolicy(name); }

PolicyEstimate Estimate(const PlanRequest& r, const char* policy) {
  absl::StatusOr<PolicyEstimate> e = EstimateRebuild(r, P(policy));
  EXPECT_TRUE(e.ok()) << policy << ": " << e.status();
  return e.ok() ? *e : PolicyEstimate{};
}

// One K/V head (kv_dim 16, K/V pair row 2 x 16 x 4 = 128 B): K/V is smaller
// than the residual, so kv-direct can only lose to kv.
TEST(Planner, GqaToyByHand) {
  const PlanRequest r = Request(Toy(1), 1e6);
  // kv: 10 x 4 B ids + 4 layers x 10 rows x 128 B = 40 + 5120 = 5160 B.
  PolicyEstimate kv = Estimate(r, "kv");
  EXPECT_EQ(kv.bytes_at_rest, 5160);
  EXPECT_EQ(kv.bytes_read, 5160);
  EXPECT_DOUBLE_EQ(kv.bytes_per_token, 516.0);
  EXPECT_EQ(kv.flops(), 0);
  EXPECT_DOUBLE_EQ(kv.estimate_s, 5160 / 1e6);
  // kv-direct: 40 + 4 x 10 x 256 = 10280 B; per layer 2 x 10 x 64 x 2 x 16 =
  // 40960 FLOPs, x 4 = 163840 -> 1.6384e-4 s; read 10.28e-3 s dominates.
  PolicyEstimate kvd = Estimate(r, "kv-direct");
  EXPECT_EQ(kvd.bytes_at_rest, 10280);
  EXPECT_DOUBLE_EQ(kvd.gemm_flops, 163840);
  EXPECT_EQ(kvd.attention_flops, 0);
  EXPECT_DOUBLE_EQ(kvd.compute_s, 1.6384e-4);
  EXPECT_DOUBLE_EQ(kvd.estimate_s, 10.28e-3);
  // tokens: per layer K/V 40960 + Q/O 163840 + MLP 491520 GEMM FLOPs and
  // 256 x (1 + ... + 10 = 55) = 14080 attention FLOPs; x 4 layers:
  // 163840 / 1e9 + (4 x 655360) / 2e9 + 56320 / 0.5e9
  // = 1.6384e-4 + 1.31072e-3 + 1.1264e-4 = 1.5872e-3 s; read 40 B = 4e-5 s.
  PolicyEstimate tok = Estimate(r, "tokens");
  EXPECT_EQ(tok.bytes_at_rest, 40);
  EXPECT_DOUBLE_EQ(tok.gemm_flops, 4 * (40960 + 655360));
  EXPECT_DOUBLE_EQ(tok.attention_flops, 56320);
  EXPECT_NEAR(tok.compute_s, 1.5872e-3, 1e-15);
  EXPECT_NEAR(tok.estimate_s, 1.5872e-3, 1e-15);
  // stride:2 keeps layers 0 and 2: 40 + 2 x 10 x 256 = 5160 B; its segments
  // run layers 0 and 2 in full and only the K/V of their tails, 1 and 3:
  // 4 x 40960 + 2 x 655360 GEMM and 2 x 14080 attention FLOPs.
  PolicyEstimate s2 = Estimate(r, "stride:2");
  EXPECT_EQ(s2.bytes_at_rest, 5160);
  EXPECT_DOUBLE_EQ(s2.flops(), 4 * 40960 + 2 * 655360 + 2 * 14080);
  EXPECT_DOUBLE_EQ(s2.estimate_s, 5.16e-3);

  // No overlap: kv-direct pays 10.28e-3 + 1.6384e-4 s.
  PlanRequest serial = r;
  serial.overlap_read_and_compute = false;
  EXPECT_DOUBLE_EQ(Estimate(serial, "kv-direct").estimate_s,
                   10.28e-3 + 1.6384e-4);

  // At 1 MB/s the re-prefill wins; at 1 GB/s reading the K/V does
  // (5.16e-6 s).
  absl::StatusOr<RebuildPlan> slow = PlanRebuild(r);
  ASSERT_TRUE(slow.ok()) << slow.status();
  EXPECT_EQ(slow->estimates[slow->chosen].policy.Name(), "tokens");
  absl::StatusOr<RebuildPlan> fast = PlanRebuild(Request(Toy(1), 1e9));
  ASSERT_TRUE(fast.ok()) << fast.status();
  EXPECT_EQ(fast->estimates[fast->chosen].policy.Name(), "kv");
}

// Four K/V heads (kv_dim 64, pair row 512 B): the residual is half the K/V,
// and at 1e7 B/s kv-direct beats both baselines because its read overlaps
// its projections.
TEST(Planner, KvDirectWinsWhereReadAndComputeOverlap) {
  const PlanRequest r = Request(Toy(4), 1e7);
  // kv: 40 + 4 x 10 x 512 = 20520 B -> 2.052e-3 s.
  EXPECT_DOUBLE_EQ(Estimate(r, "kv").estimate_s, 2.052e-3);
  // kv-direct: 10280 B -> 1.028e-3 s; 4 x 2 x 10 x 64 x 2 x 64 = 655360
  // FLOPs -> 6.5536e-4 s; max = 1.028e-3 s.
  PolicyEstimate kvd = Estimate(r, "kv-direct");
  EXPECT_DOUBLE_EQ(kvd.compute_s, 6.5536e-4);
  EXPECT_DOUBLE_EQ(kvd.estimate_s, 1.028e-3);
  // tokens: 6.5536e-4 + 1.31072e-3 + 1.1264e-4 = 2.07872e-3 s.
  EXPECT_NEAR(Estimate(r, "tokens").estimate_s, 2.07872e-3, 1e-15);
  absl::StatusOr<RebuildPlan> plan = PlanRebuild(r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->estimates[plan->chosen].policy.Name(), "kv-direct");
  EXPECT_LT(plan->estimates[plan->chosen].estimate_s, 2.052e-3);

  // stride:2 runs layers 0 and 2 in full and only the K/V of layers 1 and 3:
  // K/V 4 x 163840 = 655360 FLOPs (6.5536e-4 s), Q/O/MLP 2 x 655360
  // (6.5536e-4 s), attention 2 x 14080 (5.632e-5 s) = 1.36704e-3 s.
  EXPECT_NEAR(Estimate(r, "stride:2").compute_s, 1.36704e-3, 1e-15);
}

TEST(Planner, BudgetExcludesPolicies) {
  PlanRequest r = Request(Toy(4), 1e7);
  // 600 B/token x 10 = 6000 B: kv (20520) and kv-direct (10280) are out;
  // stride:2 and stride:3 (5160 B) and tokens (40 B) fit. stride:2 and
  // stride:3 both run two layers in full and two K/V-only (1.36704e-3 s,
  // above), tokens all four (2.07872e-3 s): the first stride wins the tie.
  r.budget_bytes_per_token = 600;
  absl::StatusOr<RebuildPlan> plan = PlanRebuild(r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (const PolicyEstimate& e : plan->estimates) {
    EXPECT_EQ(e.fits_budget, e.bytes_at_rest <= 6000) << e.policy.Name();
  }
  EXPECT_FALSE(plan->estimates[0].fits_budget);  // kv
  EXPECT_FALSE(plan->estimates[1].fits_budget);  // kv-direct
  EXPECT_EQ(plan->estimates[plan->chosen].policy.Name(), "stride:2");

  // Below the 4 B/token of the token ids nothing fits.
  r.budget_bytes_per_token = 3;
  EXPECT_EQ(PlanRebuild(r).status().code(),
            absl::StatusCode::kResourceExhausted);
}

// Layers 0-2 see 4 positions, layer 3 is global (Gemma 3's pattern, shrunk).
TEST(Planner, SlidingWindowLayersCountOnlyTheirWindow) {
  ModelConfig c = Toy(4);
  for (int l = 0; l < 3; ++l) c.layers[l].sliding_window = 4;
  const PlanRequest r = Request(c, 1e7);
  // kv: rows 4 + 4 + 4 + 10 = 22 x 512 B + 40 = 11304 B.
  EXPECT_EQ(Estimate(r, "kv").bytes_at_rest, 11304);
  // kv-direct: 22 x 256 + 40 = 5672 B; 22 rows x 16384 FLOPs = 360448.
  PolicyEstimate kvd = Estimate(r, "kv-direct");
  EXPECT_EQ(kvd.bytes_at_rest, 5672);
  EXPECT_DOUBLE_EQ(kvd.gemm_flops, 360448);
  // stride:2: segment [0,2) is all local and reaches 4 + 4 = 8 positions
  // back, segment [2,4) holds the global layer: (8 + 10) x 256 + 40 = 4648 B.
  // Segment 0 over rows p = 2..9 with window 4: layer 0 in full (K/V 8 x
  // 16384 = 131072, Q/O/MLP 8 x 65536 = 524288, attention 256 x (3 + 7 x 4
  // = 31 pairs) = 7936), layer 1's K/V only. Segment 1 over 10 rows: layer 2
  // local in full (K/V 163840, Q/O/MLP 655360, pairs 1 + 2 + 3 + 7 x 4 = 34
  // -> 8704), global layer 3's K/V only.
  PolicyEstimate s2 = Estimate(r, "stride:2");
  EXPECT_EQ(s2.bytes_at_rest, 4648);
  EXPECT_DOUBLE_EQ(s2.gemm_flops,
                   (131072 + 524288) + 131072 + (163840 + 655360) + 163840);
  EXPECT_DOUBLE_EQ(s2.attention_flops, 7936 + 8704);
  // tokens: every layer over all 10 rows; attention 3 x 8704 + 14080.
  PolicyEstimate tok = Estimate(r, "tokens");
  EXPECT_DOUBLE_EQ(tok.gemm_flops, 4 * (163840 + 655360));
  EXPECT_DOUBLE_EQ(tok.attention_flops, 3 * 8704 + 14080);
}

// The session totals agree with ComputeBytesPerToken (independent code): a
// session within the windows costs T x (4 + state); past them each further
// token costs 4 + state_past_window.
TEST(Planner, BytesAgreeWithComputeBytesPerToken) {
  ModelConfig c = Toy(2);
  c.n_layers = 12;
  c.layers.assign(12, LayerConfig{});
  for (int l = 0; l < 12; ++l) {
    if (l % 6 != 5) c.layers[l].sliding_window = 8;
  }
  for (Precision precision : {Precision::kF32, Precision::kBf16}) {
    for (const char* name :
         {"kv", "kv-direct", "stride:2", "stride:3", "stride:5", "tokens"}) {
      const BytesPerToken b = ComputeBytesPerToken(c, precision, P(name));
      PlanRequest r = Request(c, 1e9);
      r.precision = precision;
      r.tokens = 8;
      EXPECT_EQ(Estimate(r, name).bytes_at_rest, 8 * (4 + b.state)) << name;
      r.tokens = 500;
      const int64_t at_500 = Estimate(r, name).bytes_at_rest;
      r.tokens = 501;
      EXPECT_EQ(Estimate(r, name).bytes_at_rest - at_500,
                4 + b.state_past_window)
          << name;
    }
  }
}

// The bar of DESIGN.md section 4, in the planner's own model: over a sweep of
// shapes, lengths and bandwidths the choice is the minimum over the policies
// that fit and never slower than the better of kv and tokens.
TEST(Planner, NeverSlowerThanShippingKvOrReprefilling) {
  for (int64_t kv_heads : {1, 2, 4}) {
    for (int64_t t : {1, 10, 100, 1000}) {
      for (double bw = 1e5; bw <= 1e12; bw *= 10) {
        for (bool overlap : {true, false}) {
          PlanRequest r = Request(Toy(kv_heads), bw);
          r.tokens = t;
          r.overlap_read_and_compute = overlap;
          absl::StatusOr<RebuildPlan> plan = PlanRebuild(r);
          ASSERT_TRUE(plan.ok()) << plan.status();
          const double chosen = plan->estimates[plan->chosen].estimate_s;
          double kv = 0, tokens = 0, best = INFINITY;
          for (const PolicyEstimate& e : plan->estimates) {
            if (e.policy.Name() == "kv") kv = e.estimate_s;
            if (e.policy.Name() == "tokens") tokens = e.estimate_s;
            best = std::min(best, e.estimate_s);
          }
          EXPECT_LE(chosen, std::min(kv, tokens))
              << "kv heads " << kv_heads << " T " << t << " bw " << bw;
          EXPECT_EQ(chosen, best);
        }
      }
    }
  }
}

TEST(Planner, DefaultCandidatesAndBadRequests) {
  std::vector<std::string> names;
  for (const CheckpointPolicy& p : DefaultCandidates(4)) {
    names.push_back(p.Name());
  }
  EXPECT_EQ(names, (std::vector<std::string>{"kv", "kv-direct", "stride:2",
                                             "stride:3", "tokens"}));
  EXPECT_EQ(DefaultCandidates(30).size(), 9u);

  const PlanRequest good = Request(Toy(1), 1e6);
  auto code = [](const PlanRequest& r) {
    return PlanRebuild(r).status().code();
  };
  PlanRequest r = good;
  r.tokens = 0;
  EXPECT_EQ(code(r), absl::StatusCode::kInvalidArgument);
  r = good;
  r.tokens = 100001;  // past the context
  EXPECT_EQ(code(r), absl::StatusCode::kInvalidArgument);
  r = good;
  r.read_bytes_per_s = 0;
  EXPECT_EQ(code(r), absl::StatusCode::kInvalidArgument);
  r = good;
  r.rates.attention_flops_per_s = NAN;
  EXPECT_EQ(code(r), absl::StatusCode::kInvalidArgument);
  r = good;
  r.budget_bytes_per_token = -1;
  EXPECT_EQ(code(r), absl::StatusCode::kInvalidArgument);
  r = good;
  r.config.layers.clear();
  EXPECT_EQ(code(r), absl::StatusCode::kInvalidArgument);
}

// Measured path costs (calibration.h ModelPathRate) replace the FLOP count:
// recompute 1e-3 s per row, a full layer 2e-3 s per row + 1e-5 s per
// (query, key) pair; T = 10, so a layer's 10 queries see 1 + ... + 10 = 55
// pairs.
TEST(Planner, MeasuredPathCostsReplaceTheFlopCount) {
  PlanRequest r = Request(Toy(1), 1e6);
  r.rates.recompute_s_per_row = 1e-3;
  r.rates.layer_s_per_row = 2e-3;
  r.rates.layer_s_per_attention_pair = 1e-5;
  // kv-direct: 4 layers x 10 rows x 1e-3 = 0.04 s (read 10.28e-3 s).
  PolicyEstimate kvd = Estimate(r, "kv-direct");
  EXPECT_TRUE(kvd.measured_compute);
  EXPECT_DOUBLE_EQ(kvd.compute_s, 0.04);
  EXPECT_DOUBLE_EQ(kvd.estimate_s, 0.04);
  EXPECT_DOUBLE_EQ(kvd.gemm_flops, 163840);  // FLOPs are still reported
  // tokens: 4 x (10 x 2e-3 + 55 x 1e-5) = 4 x 0.02055 = 0.0822 s; stride:2
  // runs two of those layers in full and recomputes the K/V of the other
  // two: 2 x 0.02055 + 2 x 10 x 1e-3 = 0.0611 s.
  PolicyEstimate tok = Estimate(r, "tokens");
  EXPECT_TRUE(tok.measured_compute);
  EXPECT_DOUBLE_EQ(tok.compute_s, 0.0822);
  EXPECT_DOUBLE_EQ(Estimate(r, "stride:2").compute_s, 0.0611);
  // kv reads only.
  EXPECT_FALSE(Estimate(r, "kv").measured_compute);
  EXPECT_EQ(Estimate(r, "kv").compute_s, 0);

  // The choice follows the measured costs: kv-direct at 0.04 s beats tokens
  // at 0.0822 s; a recompute of 1 s per row (40 s) hands it to tokens.
  r.candidates = {P("kv-direct"), P("tokens")};
  absl::StatusOr<RebuildPlan> plan = PlanRebuild(r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->estimates[plan->chosen].policy.Name(), "kv-direct");
  r.rates.recompute_s_per_row = 1.0;
  plan = PlanRebuild(r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->estimates[plan->chosen].policy.Name(), "tokens");

  // Only the recompute measured: full layers fall back to the FLOP count
  // (GqaToyByHand: 1.5872e-3 s for tokens) and say so.
  r.rates.layer_s_per_row = 0;
  r.rates.layer_s_per_attention_pair = 0;
  tok = Estimate(r, "tokens");
  EXPECT_FALSE(tok.measured_compute);
  EXPECT_DOUBLE_EQ(tok.compute_s, 1.5872e-3);

  // A negative or non-finite measured cost is refused.
  for (double bad :
       {-1e-3, std::nan(""), std::numeric_limits<double>::infinity()}) {
    r.rates.recompute_s_per_row = bad;
    EXPECT_EQ(EstimateRebuild(r, P("kv-direct")).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

}  // namespace
}  // namespace kvd::planner
