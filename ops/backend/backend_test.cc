#include "ops/backend/backend.h"

#include <set>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvd::ops {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

DeviceProbe NoDevice() {
  DeviceProbe p;
  p.detail = "cudaGetDeviceCount: cudaErrorNoDevice: no CUDA-capable device";
  return p;
}

DeviceProbe OneH200() {
  DeviceProbe p;
  p.device_count = 1;
  p.device_name = "NVIDIA H200";
  p.detail = "1 device(s)";
  return p;
}

CudaModelSupport Serves() { return {true, ""}; }
// What CudaModelPathSupport says of a model the CUDA path cannot run.
CudaModelSupport Unservable(const std::string& model) {
  return {false, "CUDA model path cannot run " + model + " (QK-norm)"};
}

TEST(ParseBackendRequest, AcceptsTheThreeNames) {
  EXPECT_EQ(*ParseBackendRequest("auto"), BackendRequest::kAuto);
  EXPECT_EQ(*ParseBackendRequest("cpu"), BackendRequest::kCpu);
  EXPECT_EQ(*ParseBackendRequest("cuda"), BackendRequest::kCuda);
}

TEST(ParseBackendRequest, RejectsOthersNamingTheFlag) {
  for (const char* bad : {"", "gpu", "CUDA", "auto ", "metal"}) {
    absl::StatusOr<BackendRequest> r = ParseBackendRequest(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(r.status().message(), HasSubstr("--backend"));
  }
}

TEST(SelectBackend, CpuRequestIsCpuWithoutNoticeWhateverTheDevice) {
  for (const DeviceProbe& p : {NoDevice(), OneH200()}) {
    absl::StatusOr<BackendChoice> c =
        SelectBackend(BackendRequest::kCpu, p, Serves());
    ASSERT_TRUE(c.ok());
    EXPECT_EQ(c->backend, Backend::kCpu);
    EXPECT_EQ(c->notice, "");
  }
}

TEST(SelectBackend, AutoWithoutDeviceFallsBackQuietly) {
  absl::StatusOr<BackendChoice> c =
      SelectBackend(BackendRequest::kAuto, NoDevice(), Serves());
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->backend, Backend::kCpu);
  // A machine without a device is told nothing on every command; the reason
  // is kept for --verbose and kvd bench.
  EXPECT_EQ(c->notice, "");
  EXPECT_EQ(c->detail,
            "no CUDA device (cudaGetDeviceCount: cudaErrorNoDevice: no "
            "CUDA-capable device)");
}

TEST(SelectBackend, AutoWithDeviceButUnservableModelFallsBack) {
  const CudaModelSupport s = Unservable("gemma3");
  absl::StatusOr<BackendChoice> c =
      SelectBackend(BackendRequest::kAuto, OneH200(), s, true);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->backend, Backend::kCpu);
  EXPECT_THAT(c->notice, HasSubstr("cannot run gemma3 (QK-norm)"));
  EXPECT_THAT(c->notice, HasSubstr("using the CPU backend"));
}

TEST(SelectBackend, AutoTakesCudaWhenDeviceAndModelAllow) {
  absl::StatusOr<BackendChoice> c =
      SelectBackend(BackendRequest::kAuto, OneH200(), Serves(),
                    /*auto_may_pick_cuda=*/true);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->backend, Backend::kCuda);
  EXPECT_THAT(c->notice, HasSubstr("NVIDIA H200"));
}

// Until the device check has passed once, auto never lands on CUDA; an
// explicit --backend cuda still does.
TEST(SelectBackend, AutoStaysOnCpuUntilTheDeviceCheckPassed) {
  static_assert(!kCudaAutoSelectVerified,
                "flip this test with the constant, after a device check");
  absl::StatusOr<BackendChoice> c =
      SelectBackend(BackendRequest::kAuto, OneH200(), Serves());
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->backend, Backend::kCpu);
  EXPECT_THAT(c->notice, HasSubstr("device check"));
  EXPECT_THAT(c->notice, HasSubstr("--backend cuda"));
  absl::StatusOr<BackendChoice> cuda =
      SelectBackend(BackendRequest::kCuda, OneH200(), Serves());
  ASSERT_TRUE(cuda.ok());
  EXPECT_EQ(cuda->backend, Backend::kCuda);
}

TEST(SelectBackend, CudaRequestFailsInsteadOfFallingBack) {
  absl::StatusOr<BackendChoice> no_dev =
      SelectBackend(BackendRequest::kCuda, NoDevice(), Serves());
  ASSERT_FALSE(no_dev.ok());
  EXPECT_EQ(no_dev.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(no_dev.status().message(), HasSubstr("no CUDA device"));
  EXPECT_THAT(no_dev.status().message(), HasSubstr("cudaErrorNoDevice"));
  EXPECT_THAT(no_dev.status().message(), HasSubstr("--backend auto"));

  absl::StatusOr<BackendChoice> no_model =
      SelectBackend(BackendRequest::kCuda, OneH200(), Unservable("gemma3"));
  ASSERT_FALSE(no_model.ok());
  EXPECT_EQ(no_model.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(no_model.status().message(), HasSubstr("gemma3"));
  EXPECT_THAT(no_model.status().message(), Not(HasSubstr("no CUDA device")));
}

TEST(SelectBackend, CudaRequestSucceedsWhenPossible) {
  absl::StatusOr<BackendChoice> c =
      SelectBackend(BackendRequest::kCuda, OneH200(), Serves());
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->backend, Backend::kCuda);
}

TEST(BackendName, Names) {
  EXPECT_STREQ(BackendName(Backend::kCpu), "cpu");
  EXPECT_STREQ(BackendName(Backend::kCuda), "cuda");
}

TEST(CudaTpNumericsVersion, EachDegreeHasItsOwn) {
  EXPECT_EQ(CudaTpNumericsVersion(1), kCudaNumericsVersion);
  EXPECT_EQ(CudaTpNumericsVersion(0), kCudaNumericsVersion);
  std::set<uint32_t> seen = {kCudaNumericsVersion};
  for (int degree = 2; degree <= 64; ++degree) {
    EXPECT_TRUE(seen.insert(CudaTpNumericsVersion(degree)).second) << degree;
  }
}

}  // namespace
}  // namespace kvd::ops
