#include "ops/backend/cuda_probe.h"

#include <unistd.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ops/backend/choose_backend.h"

namespace kvd::ops {
namespace {

using ::testing::HasSubstr;

// Independent of the CUDA runtime: the NVIDIA driver creates /dev/nvidiactl
// when it is loaded; without it no CUDA device can be usable.
bool NvidiaDriverNodePresent() { return access("/dev/nvidiactl", F_OK) == 0; }

TEST(CudaProbe, ReportsNoDeviceWithReasonWhereThereIsNoDriver) {
  if (NvidiaDriverNodePresent()) GTEST_SKIP() << "an NVIDIA driver is loaded";
  const DeviceProbe p = ProbeCudaDevices();
  EXPECT_EQ(p.device_count, 0);
  EXPECT_EQ(p.device_name, "");
  if (BuiltWithCuda()) {
    EXPECT_THAT(p.detail, HasSubstr("cudaGetDeviceCount: cudaError"));
  } else {
    EXPECT_THAT(p.detail, HasSubstr("built without the CUDA toolkit"));
  }
}

TEST(CudaProbe, NamesTheDeviceWhereThereIsOne) {
  const DeviceProbe p = ProbeCudaDevices();
  if (p.device_count == 0) GTEST_SKIP() << "no CUDA device: " << p.detail;
  EXPECT_NE(p.device_name, "");
  EXPECT_THAT(p.detail, HasSubstr("compute capability"));
}

TEST(CudaProbe, RepeatedProbesAgree) {
  const DeviceProbe a = ProbeCudaDevices();
  const DeviceProbe b = ProbeCudaDevices();
  EXPECT_EQ(a.device_count, b.device_count);
  EXPECT_EQ(a.detail, b.detail);
}

// The end-to-end rule on this machine: today no model is servable on CUDA,
// so auto always lands on the CPU with a notice, and cuda always fails.
TEST(ChooseBackend, AutoFallsBackToCpuWithOneLine) {
  absl::StatusOr<BackendChoice> c = ChooseBackend("auto", "smollm2");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->backend, Backend::kCpu);
  EXPECT_THAT(c->notice, HasSubstr("using the CPU backend"));
  EXPECT_EQ(c->notice.find('\n'), std::string::npos);
}

TEST(ChooseBackend, CudaFailsWithFailedPrecondition) {
  absl::StatusOr<BackendChoice> c = ChooseBackend("cuda", "smollm2");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(ChooseBackend, CpuIsQuietAndBadFlagIsRejected) {
  absl::StatusOr<BackendChoice> c = ChooseBackend("cpu", "smollm2");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->backend, Backend::kCpu);
  EXPECT_EQ(c->notice, "");
  EXPECT_EQ(ChooseBackend("gpu", "smollm2").status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvd::ops
