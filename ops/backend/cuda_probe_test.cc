#include "ops/backend/cuda_probe.h"

#include <unistd.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

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

}  // namespace
}  // namespace kvd::ops
