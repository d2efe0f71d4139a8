#include "tools/kvd/backend_flag.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace kvd::cli {
namespace {

Args Parsed(const std::vector<std::string>& argv) {
  Args a("kvd test", "backend flags");
  DeclareBackendFlag(a);
  DeclarePrecisionFlag(a);
  const absl::Status st = a.Parse(argv);
  EXPECT_TRUE(st.ok()) << st;
  return a;
}

TEST(BackendFlag, DefaultsAreOneDeviceChosenAutomatically) {
  const Args a = Parsed({});
  EXPECT_EQ(*BackendRequestFromFlag(a), ops::BackendRequest::kAuto);
  const absl::StatusOr<ops::TensorParallelRequest> tp =
      TensorParallelFromFlags(a);
  ASSERT_TRUE(tp.ok()) << tp.status();
  EXPECT_EQ(tp->degree, 1);
  EXPECT_FALSE(tp->simulate);
}

TEST(BackendFlag, TensorParallelSizeAndSimulation) {
  const Args a = Parsed({"--backend", "cuda", "--tensor-parallel-size", "4",
                         "--tensor-parallel-simulate"});
  EXPECT_EQ(*BackendRequestFromFlag(a), ops::BackendRequest::kCuda);
  const absl::StatusOr<ops::TensorParallelRequest> tp =
      TensorParallelFromFlags(a);
  ASSERT_TRUE(tp.ok()) << tp.status();
  EXPECT_EQ(tp->degree, 4);
  EXPECT_TRUE(tp->simulate);
}

TEST(PrecisionFlag, AutoFollowsTheHardware) {
  EXPECT_EQ(AutoPrecision(ops::BackendRequest::kAuto, false).precision,
            ops::Precision::kF32);
  EXPECT_EQ(AutoPrecision(ops::BackendRequest::kCpu, true).precision,
            ops::Precision::kBf16);
  EXPECT_EQ(AutoPrecision(ops::BackendRequest::kCuda, false).precision,
            ops::Precision::kBf16);
  // The log says it was chosen, and why.
  EXPECT_NE(
      AutoPrecision(ops::BackendRequest::kCpu, false).why.find("AVX512-BF16"),
      std::string::npos);
  const absl::StatusOr<PrecisionChoice> dflt = PrecisionFromFlags(Parsed({}));
  ASSERT_TRUE(dflt.ok()) << dflt.status();
  EXPECT_NE(dflt->why.find("auto"), std::string::npos);
}

TEST(PrecisionFlag, GivenValuesWinAndBadOnesNameTheFlag) {
  for (const auto& [flag, want] : {std::pair{"fp32", ops::Precision::kF32},
                                   std::pair{"bf16", ops::Precision::kBf16}}) {
    const absl::StatusOr<PrecisionChoice> got =
        PrecisionFromFlags(Parsed({"--precision", flag, "--backend", "cuda"}));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->precision, want);
    EXPECT_NE(got->why.find("--precision"), std::string::npos);
  }
  const absl::StatusOr<PrecisionChoice> bad =
      PrecisionFromFlags(Parsed({"--precision", "fp16"}));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("--precision"), std::string::npos);
}

TEST(BackendFlag, BadSizesNameTheFlag) {
  for (const char* bad : {"0", "-2", "65", "two", "1.5"}) {
    const Args a = Parsed({"--tensor-parallel-size", bad});
    const absl::StatusOr<ops::TensorParallelRequest> tp =
        TensorParallelFromFlags(a);
    ASSERT_FALSE(tp.ok()) << bad;
    EXPECT_EQ(tp.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(tp.status().message().find("--tensor-parallel-size"),
              std::string::npos)
        << tp.status();
  }
  const Args lone = Parsed({"--tensor-parallel-simulate"});
  EXPECT_EQ(TensorParallelFromFlags(lone).status().code(),
            absl::StatusCode::kInvalidArgument);
  const Args a = Parsed({"--backend", "gpu"});
  EXPECT_EQ(BackendRequestFromFlag(a).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvd::cli
