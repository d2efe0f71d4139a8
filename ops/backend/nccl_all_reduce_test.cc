// Runs without a GPU: NCCL is loaded at run time, so a binary that links
// the NCCL all-reduce starts anywhere, and asking for it where it cannot
// work fails with a status that says what to do, never a crash or a
// missing-library error at start.
#include "ops/backend/nccl_all_reduce.h"

#include <vector>

#include "gtest/gtest.h"
#include "ops/backend/cuda_probe.h"

namespace kvd::ops {
namespace {

TEST(NcclAllReduce, RefusesDeviceListsItCannotUse) {
  EXPECT_EQ(NewNcclAllReduce({}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NewNcclAllReduce({0, 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(NcclAllReduce, WithoutNcclOrDevicesSaysWhy) {
  if (ProbeCudaDevices().device_count >= 2) {
    GTEST_SKIP() << "two CUDA devices: NCCL may well work here";
  }
  const std::vector<int> devices = {0, 1};
  absl::StatusOr<std::unique_ptr<AllReduce>> ar = NewNcclAllReduce(devices);
  ASSERT_FALSE(ar.ok());
  if (ar.status().code() == absl::StatusCode::kFailedPrecondition) {
    // Not loadable here: the message names the library and the fix.
    EXPECT_NE(ar.status().message().find("libnccl.so.2"),
              absl::string_view::npos)
        << ar.status();
    EXPECT_NE(ar.status().message().find("LD_LIBRARY_PATH"),
              absl::string_view::npos)
        << ar.status();
  } else {
    // Loaded (on the library path), but no two devices to join.
    EXPECT_NE(ar.status().message().find("ncclCommInitAll"),
              absl::string_view::npos)
        << ar.status();
  }
}

}  // namespace
}  // namespace kvd::ops
