// Calibration: the file format round-trips and rejects bad files, the
// measurements return sane (positive, finite) figures -- never a speed
// threshold -- and RatesAt interpolates as documented (figures by hand).
// The model-path figures are timed on a tiny model: positive, reused from the
// file, and what the planner's choice follows.
#include "services/planner/calibration.h"

#include <cmath>
#include <cstdlib>
#include <fstream>

#include "gtest/gtest.h"
#include "ops/model/model.h"
#include "ops/model/testing/tiny_model.h"
#include "services/planner/planner.h"

namespace kvd::planner {
namespace {

using ops::CheckpointPolicy;
using ops::LoadOptions;
using ops::Model;
using ops::ModelConfig;
using ops::Precision;

bool Sane(double x) { return std::isfinite(x) && x > 0; }

std::string TempDir() {
  const char* d = std::getenv("TEST_TMPDIR");
  return d != nullptr ? d : "/tmp";
}

ModelConfig Small() {
  ModelConfig c;
  c.name = "small";
  c.n_layers = 2;
  c.d_model = 64;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 16;
  c.d_ff = 96;
  c.layers.resize(2);
  return c;
}

TEST(Calibration, JsonRoundTrip) {
  Calibration c;
  c.gemm.push_back({"bf16", 192, 576, 64, 2, 1.5e11});
  c.attention.push_back({"fp32", 3, 64, 1024, 1, 3.25e10});
  c.storage.push_back({"/var/tmp", 1 << 28, 2.5e9, true});
  const std::string path = TempDir() + "/cal.json";
  ASSERT_TRUE(WriteCalibrationFile(c, path).ok());
  absl::StatusOr<Calibration> back = ReadCalibrationFile(path);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->gemm.size(), 1u);
  EXPECT_EQ(back->gemm[0].weights, "bf16");
  EXPECT_EQ(back->gemm[0].n, 192);
  EXPECT_EQ(back->gemm[0].k, 576);
  EXPECT_EQ(back->gemm[0].m, 64);
  EXPECT_EQ(back->gemm[0].threads, 2);
  EXPECT_EQ(back->gemm[0].flops_per_s, 1.5e11);
  ASSERT_EQ(back->attention.size(), 1u);
  EXPECT_EQ(back->attention[0].group, 3);
  EXPECT_EQ(back->attention[0].keys, 1024);
  EXPECT_EQ(back->attention[0].flops_per_s, 3.25e10);
  ASSERT_NE(FindStorage(*back, "/var/tmp"), nullptr);
  EXPECT_TRUE(FindStorage(*back, "/var/tmp")->cache_dropped);
  EXPECT_EQ(FindStorage(*back, "/var/tmp")->bytes_per_s, 2.5e9);
  EXPECT_EQ(FindStorage(*back, "/elsewhere"), nullptr);
}

TEST(Calibration, BadFilesAreRefused) {
  EXPECT_EQ(ReadCalibrationFile(TempDir() + "/no-such.json").status().code(),
            absl::StatusCode::kNotFound);
  for (const char* bad :
       {"", "[1, 2]", "{\"gemm\": []}", "{\"version\": 2}",
        "{\"version\": 1, \"gemm\": [{\"weights\": \"fp32\"}]}",
        "{\"version\": 1, \"gemm\": [{\"weights\": \"fp32\", \"n\": 1, "
        "\"k\": 1, \"m\": 1, \"threads\": 1, \"flops_per_s\": -5}]}",
        "{\"version\": 1, \"storage\": [{\"directory\": 7}]}"}) {
    absl::StatusOr<Calibration> c = CalibrationFromJson(bad, "x.json");
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    if (!c.ok()) {
      EXPECT_NE(c.status().message().find("x.json"), std::string::npos);
    }
  }
}

TEST(Calibration, MeasurementsAreSane) {
  kernels::cpu::ThreadPool pool(2);
  for (const char* dtype : {"fp32", "bf16"}) {
    absl::StatusOr<double> g = MeasureGemmFlops(dtype, 64, 96, 8, &pool, 0.01);
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_TRUE(Sane(*g)) << *g;
    absl::StatusOr<double> a =
        MeasureAttentionFlops(dtype, 2, 16, 128, &pool, 0.01);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_TRUE(Sane(*a)) << *a;
  }
  EXPECT_FALSE(MeasureGemmFlops("fp16", 4, 4, 4, &pool, 0.01).ok());
  EXPECT_FALSE(MeasureGemmFlops("fp32", 0, 4, 4, &pool, 0.01).ok());
  EXPECT_FALSE(MeasureAttentionFlops("fp32", 1, 16, 8, &pool, 0.01).ok());

  absl::StatusOr<StorageRate> s = MeasureReadBandwidth(TempDir(), 16 << 20);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(Sane(s->bytes_per_s));
  EXPECT_EQ(s->file_bytes, 16 << 20);
  std::cout << "read " << s->bytes_per_s
            << " B/s, page cache dropped: " << s->cache_dropped << "\n";
  EXPECT_FALSE(MeasureReadBandwidth("/no/such/dir", 16 << 20).ok());
  EXPECT_FALSE(MeasureReadBandwidth(TempDir(), 1024).ok());
}

TEST(Calibration, EnsureMeasuresOnlyWhatIsMissing) {
  kernels::cpu::ThreadPool pool(1);
  CalibrationOptions options;
  options.ms = {1, 8};
  options.attention_keys = 128;
  options.min_seconds = 0.005;
  Calibration c;
  absl::StatusOr<bool> first =
      EnsureModelRates(Small(), Precision::kF32, &pool, options, &c);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(*first);
  // Two shapes (K/V 32 x 64, MLP 96 x 64) x two row counts, one attention.
  ASSERT_EQ(c.gemm.size(), 4u);
  ASSERT_EQ(c.attention.size(), 1u);
  EXPECT_EQ(c.attention[0].group, 2);
  for (const GemmRate& g : c.gemm) EXPECT_TRUE(Sane(g.flops_per_s));
  absl::StatusOr<bool> again =
      EnsureModelRates(Small(), Precision::kF32, &pool, options, &c);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(*again);
  EXPECT_EQ(c.gemm.size(), 4u);
  // Another precision is another set of entries.
  absl::StatusOr<bool> bf16 =
      EnsureModelRates(Small(), Precision::kBf16, &pool, options, &c);
  ASSERT_TRUE(bf16.ok());
  EXPECT_TRUE(*bf16);
  EXPECT_EQ(c.gemm.size(), 8u);
  absl::StatusOr<RebuildRates> r =
      RatesAt(c, Small(), Precision::kF32, 1, 4, 128);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(Sane(r->kv_projection_flops_per_s));
  EXPECT_TRUE(Sane(r->layer_gemm_flops_per_s));
  EXPECT_TRUE(Sane(r->attention_flops_per_s));
}

TEST(Calibration, RatesInterpolateInLogRows) {
  const ModelConfig c = Small();  // K/V shape 32 x 64, MLP 96 x 64, group 2
  Calibration cal;
  cal.gemm = {{"fp32", 32, 64, 1, 2, 1e9},
              {"fp32", 32, 64, 64, 2, 4e9},
              {"fp32", 96, 64, 1, 2, 2e9},
              {"fp32", 96, 64, 64, 2, 8e9}};
  cal.attention = {{"fp32", 2, 16, 256, 2, 5e9}, {"fp32", 2, 16, 4096, 2, 3e9}};
  // m = 8 is halfway between 1 and 64 in log m: 1e9 + (4e9 - 1e9) / 2.
  absl::StatusOr<RebuildRates> r = RatesAt(cal, c, Precision::kF32, 2, 8, 300);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_DOUBLE_EQ(r->kv_projection_flops_per_s, 2.5e9);
  EXPECT_DOUBLE_EQ(r->layer_gemm_flops_per_s, 5e9);
  EXPECT_EQ(r->attention_flops_per_s, 5e9);  // 300 is nearer 256
  // Clamped beyond the measured rows; attention nearest 4096.
  r = RatesAt(cal, c, Precision::kF32, 2, 1000, 3000);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->kv_projection_flops_per_s, 4e9);
  EXPECT_EQ(r->attention_flops_per_s, 3e9);
  // Other threads or precision: not calibrated.
  EXPECT_EQ(RatesAt(cal, c, Precision::kF32, 1, 8, 300).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(RatesAt(cal, c, Precision::kBf16, 2, 8, 300).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// Two block timings by hand: block 2, context 4. Near block [0, 2): 1 + 2 = 3
// pairs; far block [2, 4): 3 + 4 = 7 pairs. With 1e-3 s per row and 1e-4 s
// per pair: near 2e-3 + 3e-4 = 2.3e-3 s, far 2e-3 + 7e-4 = 2.7e-3 s.
TEST(Calibration, LayerCostFitByHand) {
  ModelPathRate r;
  r.block = 2;
  r.context = 4;
  r.layer_near_s = 2.3e-3;
  r.layer_far_s = 2.7e-3;
  LayerCost cost = FitLayerCost(r);
  EXPECT_NEAR(cost.per_row_s, 1e-3, 1e-15);
  EXPECT_NEAR(cost.per_pair_s, 1e-4, 1e-15);
  // Noise making the far block faster: no negative pair cost; all per row.
  r.layer_far_s = 2.0e-3;
  cost = FitLayerCost(r);
  EXPECT_EQ(cost.per_pair_s, 0);
  EXPECT_DOUBLE_EQ(cost.per_row_s, 2.3e-3 / 2);
}

TEST(Calibration, ModelPathJsonRoundTripAndBadEntries) {
  Calibration c;
  ModelPathRate r;
  r.model = "m";
  r.n_layers = 30;
  r.d_model = 576;
  r.kv_dim = 192;
  r.d_ff = 1536;
  r.precision = "bf16";
  r.threads = 2;
  r.block = 256;
  r.layer = 0;
  r.recompute_rows = 1024;
  r.recompute_s_per_row = 2.5e-6;
  r.context = 1024;
  r.layer_near_s = 0.01;
  r.layer_far_s = 0.02;
  c.model_paths.push_back(r);
  absl::StatusOr<Calibration> back =
      CalibrationFromJson(CalibrationToJson(c), "rt.json");
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->model_paths.size(), 1u);
  const ModelPathRate& b = back->model_paths[0];
  EXPECT_EQ(b.model, "m");
  EXPECT_EQ(b.kv_dim, 192);
  EXPECT_EQ(b.precision, "bf16");
  EXPECT_EQ(b.block, 256);
  EXPECT_EQ(b.recompute_s_per_row, 2.5e-6);
  EXPECT_EQ(b.layer_far_s, 0.02);
  // A file from before model paths existed still reads (no list: empty).
  absl::StatusOr<Calibration> old =
      CalibrationFromJson("{\"version\": 1, \"gemm\": []}", "old.json");
  ASSERT_TRUE(old.ok());
  EXPECT_TRUE(old->model_paths.empty());
  c.model_paths[0].recompute_s_per_row = -1;
  absl::StatusOr<Calibration> bad =
      CalibrationFromJson(CalibrationToJson(c), "bad.json");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("bad.json"), std::string::npos);
}

// The real paths of a tiny model: the figures are positive, measured once,
// reach the planner through RatesAt, and steer its choice.
TEST(Calibration, ModelPathsOnATinyModelSteerThePlanner) {
  ops::testing::TinyModelSpec spec;
  absl::StatusOr<std::string> path =
      ops::testing::WriteTinyModel(spec, TempDir());
  ASSERT_TRUE(path.ok()) << path.status();
  LoadOptions load;
  load.precision = Precision::kBf16;
  load.num_threads = 2;
  absl::StatusOr<std::unique_ptr<Model>> model = Model::Load(*path, load);
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelConfig& config = (*model)->config();

  CalibrationOptions options;
  options.ms = {1, 64};
  options.attention_keys = 256;
  options.min_seconds = 0.005;
  options.path_block = 64;
  options.recompute_rows = 256;
  options.path_context = 256;
  options.path_repeats = 3;
  Calibration cal;
  ASSERT_TRUE(EnsureModelRates(config, Precision::kBf16, (*model)->pool(),
                               options, &cal)
                  .ok());
  absl::StatusOr<bool> measured = EnsureModelPathRates(**model, options, &cal);
  ASSERT_TRUE(measured.ok()) << measured.status();
  EXPECT_TRUE(*measured);
  ASSERT_EQ(cal.model_paths.size(), 1u);
  const ModelPathRate& p = cal.model_paths[0];
  EXPECT_EQ(p.model, config.name);
  EXPECT_EQ(p.precision, "bf16");
  EXPECT_EQ(p.threads, 2);
  EXPECT_EQ(p.block, 64);
  EXPECT_EQ(p.context, 256);
  EXPECT_TRUE(Sane(p.recompute_s_per_row)) << p.recompute_s_per_row;
  EXPECT_TRUE(Sane(p.layer_near_s));
  EXPECT_TRUE(Sane(p.layer_far_s));
  std::cout << "tiny llama bf16: recompute " << p.recompute_s_per_row * 1e9
            << " ns/row; layer block near " << p.layer_near_s * 1e6
            << " us, far " << p.layer_far_s * 1e6 << " us\n";
  // Present: not measured again.
  measured = EnsureModelPathRates(**model, options, &cal);
  ASSERT_TRUE(measured.ok());
  EXPECT_FALSE(*measured);
  EXPECT_EQ(cal.model_paths.size(), 1u);

  absl::StatusOr<RebuildRates> rates =
      RatesAt(cal, config, Precision::kBf16, 2, 64, 256);
  ASSERT_TRUE(rates.ok()) << rates.status();
  EXPECT_EQ(rates->recompute_s_per_row, p.recompute_s_per_row);
  const LayerCost layer = FitLayerCost(p);
  EXPECT_EQ(rates->layer_s_per_row, layer.per_row_s);
  EXPECT_EQ(rates->layer_s_per_attention_pair, layer.per_pair_s);
  EXPECT_GT(rates->layer_s_per_row + rates->layer_s_per_attention_pair, 0);

  PlanRequest request;
  request.config = config;
  request.precision = Precision::kBf16;
  request.tokens = 1000;
  request.read_bytes_per_s = 1e15;  // compute decides
  request.rates = *rates;
  request.candidates = {{CheckpointPolicy::Kind::kKvDirect, 1},
                        {CheckpointPolicy::Kind::kTokens, 1}};
  absl::StatusOr<RebuildPlan> plan = PlanRebuild(request);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const PolicyEstimate& kvd = plan->estimates[0];
  EXPECT_TRUE(kvd.measured_compute);
  EXPECT_DOUBLE_EQ(kvd.compute_s,
                   1000.0 * config.n_layers * p.recompute_s_per_row);
  // A recompute a million times dearer than measured loses to re-prefilling.
  request.rates.recompute_s_per_row *= 1e6;
  plan = PlanRebuild(request);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->estimates[plan->chosen].policy.Name(), "tokens");
  // And a free one wins.
  request.rates.recompute_s_per_row = 1e-15;
  plan = PlanRebuild(request);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->estimates[plan->chosen].policy.Name(), "kv-direct");

  // Without a model-path entry (no model loaded) the planner counts FLOPs.
  cal.model_paths.clear();
  rates = RatesAt(cal, config, Precision::kBf16, 2, 64, 256);
  ASSERT_TRUE(rates.ok());
  EXPECT_EQ(rates->recompute_s_per_row, 0);
  request.rates = *rates;
  plan = PlanRebuild(request);
  ASSERT_TRUE(plan.ok());
  EXPECT_FALSE(plan->estimates[0].measured_compute);
}

}  // namespace
}  // namespace kvd::planner
