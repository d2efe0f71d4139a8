// OpenBackend end to end on this machine: the real device probe and, with
// the toolkit, the real CudaBackendModel::Create. Without a device, auto
// lands on the CPU model with one line saying why and cuda fails; with one,
// cuda runs the model on it and auto stays on the CPU until the device check
// has passed (kCudaAutoSelectVerified).
#include "ops/backend/open_backend.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ops/backend/cuda_probe.h"
#include "ops/model/testing/tiny_model.h"

namespace kvd::ops {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<Model> TinyBf16Llama() {
  absl::StatusOr<std::unique_ptr<Model>> model =
      testing::LoadTinyModel({}, Precision::kBf16);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? *std::move(model) : nullptr;
}

TEST(OpenBackend, CpuIsTheModelItselfQuietly) {
  auto model = TinyBf16Llama();
  ASSERT_NE(model, nullptr);
  absl::StatusOr<OpenedBackend> b = OpenBackend(BackendRequest::kCpu, *model);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->kind, Backend::kCpu);
  EXPECT_EQ(b->backend, model.get());
  EXPECT_EQ(b->owned, nullptr);
  EXPECT_EQ(b->notice, "");
  EXPECT_STREQ(b->backend->backend_name(), "cpu");
}

TEST(OpenBackend, AutoLandsOnTheCpuQuietlyWithoutADeviceOrWithOneLine) {
  auto model = TinyBf16Llama();
  ASSERT_NE(model, nullptr);
  absl::StatusOr<OpenedBackend> b = OpenBackend(BackendRequest::kAuto, *model);
  ASSERT_TRUE(b.ok()) << b.status();
  // Without a device, or with one before the device check has passed.
  ASSERT_FALSE(kCudaAutoSelectVerified);
  EXPECT_EQ(b->kind, Backend::kCpu);
  EXPECT_EQ(b->backend, model.get());
  if (ProbeCudaDevices().device_count == 0) {
    EXPECT_EQ(b->notice, "");  // nothing about CUDA on a machine without it
  } else {
    EXPECT_THAT(b->notice, HasSubstr("CPU backend"));
    EXPECT_EQ(b->notice.find('\n'), std::string::npos);
  }
}

TEST(OpenBackend, CudaFailsWithoutADeviceAndRunsWithOne) {
  auto model = TinyBf16Llama();
  ASSERT_NE(model, nullptr);
  absl::StatusOr<OpenedBackend> b = OpenBackend(BackendRequest::kCuda, *model);
  if (ProbeCudaDevices().device_count == 0) {
    ASSERT_FALSE(b.ok());
    EXPECT_EQ(b.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(b.status().message(), HasSubstr("--backend cuda"));
    return;
  }
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->kind, Backend::kCuda);
  ASSERT_NE(b->owned, nullptr);
  EXPECT_EQ(b->backend, b->owned.get());
  EXPECT_STREQ(b->backend->backend_name(), "cuda");
  EXPECT_EQ(b->backend->numerics_version(), kCudaNumericsVersion);
}

TEST(PrecheckBackend, OnlyCudaWithoutADeviceFailsBeforeTheModelLoads) {
  EXPECT_TRUE(PrecheckBackend(BackendRequest::kCpu).ok());
  EXPECT_TRUE(PrecheckBackend(BackendRequest::kAuto).ok());
  const absl::Status cuda = PrecheckBackend(BackendRequest::kCuda);
  if (ProbeCudaDevices().device_count > 0) {
    EXPECT_TRUE(cuda.ok()) << cuda;
  } else {
    EXPECT_EQ(cuda.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(cuda.message(), HasSubstr("no CUDA device"));
  }
}

TEST(OpenBackend, CudaRefusesAModelItsPathCannotRun) {
  absl::StatusOr<std::unique_ptr<Model>> fp32 =
      testing::LoadTinyModel({}, Precision::kF32);
  ASSERT_TRUE(fp32.ok()) << fp32.status();
  absl::StatusOr<OpenedBackend> b = OpenBackend(BackendRequest::kCuda, **fp32);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kFailedPrecondition);
  // Without a device that is the first reason; with one, the precision.
  if (ProbeCudaDevices().device_count > 0) {
    EXPECT_THAT(b.status().message(), HasSubstr("fp32"));
  }
}

TEST(OpenBackend, TensorParallelFlagsThatContradictAreRefused) {
  auto model = TinyBf16Llama();
  ASSERT_NE(model, nullptr);
  // CPU shards are processes that the node starts (services/worker), so
  // the flags are fine together, but not a one-process backend.
  absl::StatusOr<OpenedBackend> cpu =
      OpenBackend(BackendRequest::kCpu, *model, {2});
  ASSERT_FALSE(cpu.ok());
  EXPECT_EQ(cpu.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(cpu.status().message(), HasSubstr("worker processes"));
  EXPECT_TRUE(PrecheckBackend(BackendRequest::kCpu, {2}).ok());
  EXPECT_EQ(
      PrecheckBackend(BackendRequest::kCpu, {2, /*simulate=*/true}).code(),
      absl::StatusCode::kInvalidArgument);
  for (int degree : {0, -1}) {
    EXPECT_EQ(
        OpenBackend(BackendRequest::kAuto, *model, {degree}).status().code(),
        absl::StatusCode::kInvalidArgument);
  }
  // Degree 1 is the ordinary choice.
  absl::StatusOr<OpenedBackend> one =
      OpenBackend(BackendRequest::kCpu, *model, {1});
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->backend, model.get());
}

TEST(OpenBackend, TensorParallelRunsOnGpusOrSaysWhatIsMissing) {
  auto model = TinyBf16Llama();
  ASSERT_NE(model, nullptr);
  const int devices = ProbeCudaDevices().device_count;
  // auto with a degree above 1 means CUDA: no quiet fallback to the CPU.
  absl::StatusOr<OpenedBackend> b =
      OpenBackend(BackendRequest::kAuto, *model, {2});
  const absl::Status pre = PrecheckBackend(BackendRequest::kAuto, {2});
  if (devices == 0) {
    ASSERT_FALSE(b.ok());
    EXPECT_EQ(b.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(b.status().message(), HasSubstr("--tensor-parallel-size 2"));
    EXPECT_EQ(pre.code(), absl::StatusCode::kFailedPrecondition);
    return;
  }
  if (devices < 2) {
    // One GPU: not enough for two shards, before and after the model loads.
    EXPECT_EQ(pre.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(pre.message(), HasSubstr("--tensor-parallel-simulate"));
    ASSERT_FALSE(b.ok());
    EXPECT_THAT(b.status().message(), HasSubstr("--tensor-parallel-simulate"));
    EXPECT_TRUE(PrecheckBackend(BackendRequest::kAuto, {2, true}).ok());
  } else {
    EXPECT_TRUE(pre.ok()) << pre;
  }
  absl::StatusOr<OpenedBackend> sim =
      OpenBackend(BackendRequest::kCuda, *model, {2, /*simulate=*/true});
  ASSERT_TRUE(sim.ok()) << sim.status();
  EXPECT_EQ(sim->kind, Backend::kCuda);
  EXPECT_STREQ(sim->backend->backend_name(), "cuda-tp");
  EXPECT_EQ(sim->backend->numerics_version(), CudaTpNumericsVersion(2));
  EXPECT_THAT(sim->notice, HasSubstr("simulated"));
}

}  // namespace
}  // namespace kvd::ops
