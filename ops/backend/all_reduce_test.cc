// Device tests (requires-gpu; skipped with the reason where there is no CUDA
// device) of the all-reduces' one numerics contract: every implementation
// leaves ((b0 + b1) + b2) + ... in shard order, one fp32 add per element,
// in every shard's buffer. The host computes the same adds in float (IEEE
// round to nearest, as the device's), so the bits must match exactly.
//   (a) AddPartialsInShardOrder, into a separate buffer and in place;
//   (b) the simulated all-reduce at degree 3 on one stream;
//   (c) the NCCL all-reduce over the devices there are (degree 1 on one
//       GPU, else 2), equal to the simulation's bits; skipped with NCCL's
//       reason where libnccl.so.2 cannot be loaded.
#include "ops/backend/all_reduce.h"

#include <cuda_runtime.h>

#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/internal/test_util.h"
#include "ops/backend/cuda_probe.h"
#include "ops/backend/nccl_all_reduce.h"

namespace kvd::ops {
namespace {

namespace kt = ::kvd::kernels::cuda::testing;

// ((p0 + p1) + p2) + ... in float, element by element.
std::vector<float> HostSum(const std::vector<std::vector<float>>& parts) {
  std::vector<float> sum = parts[0];
  for (size_t s = 1; s < parts.size(); ++s)
    for (size_t i = 0; i < sum.size(); ++i) sum[i] = sum[i] + parts[s][i];
  return sum;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<std::vector<float>> Partials(int shards, size_t count) {
  std::mt19937_64 rng(kt::TestSeed());
  std::vector<std::vector<float>> parts;
  // Mixed magnitudes, so the order of the adds shows in the low bits.
  for (int s = 0; s < shards; ++s) {
    std::vector<float> p = kt::RandomFloats(count, &rng);
    for (size_t i = 0; i < count; i += 7) p[i] *= 1e4f;
    parts.push_back(std::move(p));
  }
  return parts;
}

TEST(AllReduce, PartialsAreAddedInShardOrder) {
  KVD_REQUIRE_GPU();
  const size_t count = 100003;  // not a multiple of any block size
  const auto parts = Partials(4, count);
  const std::vector<float> want = HostSum(parts);
  // The order matters for these inputs: the reverse order differs somewhere.
  std::vector<std::vector<float>> reversed(parts.rbegin(), parts.rend());
  ASSERT_FALSE(SameBits(HostSum(reversed), want))
      << "inputs too tame to tell the order of the adds";

  std::vector<std::unique_ptr<kt::DeviceBuffer<float>>> dev;
  std::vector<const float*> ptrs;
  for (const auto& p : parts) {
    dev.push_back(std::make_unique<kt::DeviceBuffer<float>>(count));
    ASSERT_EQ(dev.back()->Upload(p), cudaSuccess);
    ptrs.push_back(dev.back()->get());
  }
  kt::DeviceBuffer<float> dst(count);
  ASSERT_EQ(dst.Poison(), cudaSuccess);
  ASSERT_TRUE(AddPartialsInShardOrder(dst.get(), ptrs, count, nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> got;
  ASSERT_EQ(dst.Download(&got), cudaSuccess);
  EXPECT_TRUE(SameBits(got, want)) << "into a separate buffer";

  // In place, into partial 0.
  ASSERT_TRUE(
      AddPartialsInShardOrder(dev[0]->get(), ptrs, count, nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_EQ(dev[0]->Download(&got), cudaSuccess);
  EXPECT_TRUE(SameBits(got, want)) << "in place";
}

TEST(AllReduce, SimulatedLeavesTheSumInEveryShard) {
  KVD_REQUIRE_GPU();
  const size_t count = 4099;
  const auto parts = Partials(3, count);
  const std::vector<float> want = HostSum(parts);
  std::vector<std::unique_ptr<kt::DeviceBuffer<float>>> dev;
  std::vector<float*> ptrs;
  for (const auto& p : parts) {
    dev.push_back(std::make_unique<kt::DeviceBuffer<float>>(count));
    ASSERT_EQ(dev.back()->Upload(p), cudaSuccess);
    ptrs.push_back(dev.back()->get());
  }
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  std::vector<void*> streams(3, stream);
  auto ar = NewSimulatedAllReduce(3);
  ASSERT_TRUE(ar->Reserve(count, streams).ok());
  ASSERT_TRUE(ar->SumInPlace(ptrs, count, streams).ok());
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  for (int s = 0; s < 3; ++s) {
    std::vector<float> got;
    ASSERT_EQ(dev[s]->Download(&got), cudaSuccess);
    EXPECT_TRUE(SameBits(got, want)) << "shard " << s;
  }
  // Shards on different streams cannot be ordered by the simulation.
  cudaStream_t other = nullptr;
  ASSERT_EQ(cudaStreamCreate(&other), cudaSuccess);
  streams[1] = other;
  EXPECT_EQ(ar->SumInPlace(ptrs, count, streams).code(),
            absl::StatusCode::kInvalidArgument);
  cudaStreamDestroy(other);
  cudaStreamDestroy(stream);
}

TEST(AllReduce, NcclGivesTheSimulationsBits) {
  KVD_REQUIRE_GPU();
  const int devices = std::min(ProbeCudaDevices().device_count, 2);
  std::vector<int> ids;
  for (int d = 0; d < devices; ++d) ids.push_back(d);
  absl::StatusOr<std::unique_ptr<AllReduce>> nccl = NewNcclAllReduce(ids);
  if (!nccl.ok() &&
      nccl.status().code() == absl::StatusCode::kFailedPrecondition) {
    GTEST_SKIP() << nccl.status();
  }
  ASSERT_TRUE(nccl.ok()) << nccl.status();
  EXPECT_EQ((*nccl)->devices(), ids);
  const size_t count = 30011;
  const auto parts = Partials(devices, count);
  const std::vector<float> want = HostSum(parts);
  std::vector<std::unique_ptr<kt::DeviceBuffer<float>>> dev;
  std::vector<float*> ptrs;
  std::vector<void*> streams;
  for (int s = 0; s < devices; ++s) {
    ASSERT_EQ(cudaSetDevice(s), cudaSuccess);
    dev.push_back(std::make_unique<kt::DeviceBuffer<float>>(count));
    ASSERT_EQ(dev.back()->Upload(parts[s]), cudaSuccess);
    ptrs.push_back(dev.back()->get());
    cudaStream_t st = nullptr;
    ASSERT_EQ(cudaStreamCreate(&st), cudaSuccess);
    streams.push_back(st);
  }
  ASSERT_TRUE((*nccl)->Reserve(count, streams).ok());
  ASSERT_TRUE((*nccl)->SumInPlace(ptrs, count, streams).ok());
  for (int s = 0; s < devices; ++s) {
    ASSERT_EQ(cudaSetDevice(s), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(static_cast<cudaStream_t>(streams[s])),
              cudaSuccess);
    std::vector<float> got;
    ASSERT_EQ(dev[s]->Download(&got), cudaSuccess);
    EXPECT_TRUE(SameBits(got, want)) << "shard " << s;
    cudaStreamDestroy(static_cast<cudaStream_t>(streams[s]));
  }
  std::printf("[ all-reduce ] NCCL over %d device(s) == shard-order sum: %s\n",
              devices, ::testing::Test::HasFailure() ? "DIFFERENT" : "bits");
}

}  // namespace
}  // namespace kvd::ops
