// ChooseCheckpointPolicy on a tiny model: the choice is the plan's fastest,
// the figures are measured once and read back from the file afterwards, and
// a backend without K/V row access never gets kv.
#include "services/planner/auto_policy.h"

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "ops/model/testing/tiny_model.h"

namespace kvd::planner {
namespace {

// A tiny model (2 K/V heads of 16: K/V rows smaller than a residual) and
// options pointing at a fresh directory.
class AutoPolicyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ops::testing::TinyModelSpec spec;
    auto model = ops::testing::LoadTinyModel(spec, ops::Precision::kF32);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = *std::move(model);
    const std::filesystem::path dir =
        std::filesystem::path(::testing::TempDir()) /
        ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    options_.calibration_path = (dir / "calibration.json").string();
    options_.storage_dir = dir.string();
    options_.tokens = 512;
  }

  std::unique_ptr<ops::Model> model_;
  AutoPolicyOptions options_;
};

TEST_F(AutoPolicyTest, ChoosesThePlansFastestAndMeasuresOnce) {
  AutoPolicyOptions& o = options_;
  absl::StatusOr<AutoPolicy> first = ChooseCheckpointPolicy(*model_, o);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->measured_now);
  EXPECT_TRUE(std::filesystem::exists(o.calibration_path));
  const RebuildPlan& plan = first->plan;
  ASSERT_GE(plan.chosen, 0);
  EXPECT_EQ(first->policy.Name(), plan.estimates[plan.chosen].policy.Name());
  for (const PolicyEstimate& e : plan.estimates) {
    EXPECT_LE(plan.estimates[plan.chosen].estimate_s, e.estimate_s)
        << e.policy.Name();
  }
  // kv reads fewer bytes than kv-direct here and computes nothing.
  EXPECT_EQ(first->policy.Name(), "kv");
  EXPECT_NE(first->summary.find("policy auto: kv "), std::string::npos)
      << first->summary;

  // The second start reads every figure from the file.
  absl::StatusOr<AutoPolicy> again = ChooseCheckpointPolicy(*model_, o);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(again->measured_now);
  EXPECT_EQ(again->policy.Name(), "kv");
  EXPECT_EQ(again->read_bytes_per_s, first->read_bytes_per_s);

  // A backend that cannot copy K/V rows: kv is not a candidate.
  o.kv_candidate = false;
  absl::StatusOr<AutoPolicy> no_kv = ChooseCheckpointPolicy(*model_, o);
  ASSERT_TRUE(no_kv.ok()) << no_kv.status();
  EXPECT_NE(no_kv->policy.Name(), "kv");
  for (const PolicyEstimate& e : no_kv->plan.estimates)
    EXPECT_NE(e.policy.Name(), "kv");

  // A budget of token ids only leaves tokens.
  o.budget_bytes_per_token = 4;
  absl::StatusOr<AutoPolicy> tight = ChooseCheckpointPolicy(*model_, o);
  ASSERT_TRUE(tight.ok()) << tight.status();
  EXPECT_EQ(tight->policy.Name(), "tokens");
}

TEST_F(AutoPolicyTest, AnUnreadableCalibrationFileIsAnError) {
  AutoPolicyOptions& o = options_;
  {
    FILE* f = std::fopen(o.calibration_path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs("not json", f);
    std::fclose(f);
  }
  EXPECT_EQ(ChooseCheckpointPolicy(*model_, o).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvd::planner
