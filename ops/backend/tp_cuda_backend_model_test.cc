// Device tests (requires-gpu; skipped with the reason where there is no CUDA
// device) of the tensor-parallel backend the session engine runs on, with
// the shards simulated on one GPU. What the ModelBackend conformance suite
// does not cover (it registers this backend in cuda_backend_conformance_test:
// batch and chunking invariance, the observer, shard-local recompute and
// ForwardLayers rebuilding caches bit for bit, full pools, bad input):
//   (a) the backend's logits at every greedy step equal TpCudaModel's (the
//       tested tensor-parallel forward pass) bit for bit at each degree,
//       so everything tp_cuda_model_test shows about TP carries over;
//   (b) degree 1 equals the single-GPU backend (CudaBackendModel) bit for
//       bit;
//   (c) its identity (name, numerics version per degree) and its refusals:
//       pools of other backends, a degree the model does not split into.
// Bounded hot windows on shards: cuda_backend_model_test's
// CudaBoundedWindowTest runs them at degree 2.
#include "ops/backend/tp_cuda_backend_model.h"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/internal/test_util.h"
#include "ops/backend/backend.h"
#include "ops/backend/cuda_backend_model.h"
#include "ops/backend/tensor_parallel_plan.h"
#include "ops/backend/testing/cuda_model_cases.h"
#include "ops/backend/tp_cuda_model.h"

namespace kvd::ops {
namespace {

using testing::CudaCasePrompts;
using testing::CudaCaseSpec;
using testing::LoadTinyModel;
using testing::SameBits;

constexpr int64_t kSteps = 12;

// Greedy decoding through the backend interface: the logits before each
// chosen token (prefill's last row, then each decode step's), as
// TpCudaModel::Generate's step_logits.
std::vector<std::vector<float>> BackendGreedy(
    const ModelBackend& backend, const std::vector<int32_t>& prompt,
    int64_t steps) {
  std::vector<std::vector<float>> out;
  auto pool = backend.NewBlockPool({});
  EXPECT_TRUE(pool.ok()) << pool.status();
  if (!pool.ok()) return out;
  auto cache = backend.NewCache(pool->get());
  EXPECT_TRUE(cache.ok()) << cache.status();
  if (!cache.ok()) return out;
  std::vector<int32_t> feed = prompt;
  for (int64_t i = 0; i < steps; ++i) {
    SequenceStep step{&*cache, feed, LogitsMode::kLast};
    ForwardOutput fo;
    const absl::Status st = backend.Forward({&step, 1}, &fo);
    EXPECT_TRUE(st.ok()) << st;
    if (!st.ok()) return out;
    out.push_back(fo.logits);
    feed = {static_cast<int32_t>(
        std::max_element(fo.logits.begin(), fo.logits.end()) -
        fo.logits.begin())};
  }
  return out;
}

class TpCudaBackendModelTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    KVD_REQUIRE_GPU();
    auto cpu = LoadTinyModel(CudaCaseSpec(GetParam()), Precision::kBf16, 4);
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    cpu_ = std::move(*cpu);
  }

  std::unique_ptr<TpCudaBackendModel> Backend(int degree) {
    TpCudaBackendOptions o;
    o.degree = degree;
    auto m = TpCudaBackendModel::Create(*cpu_, o);
    EXPECT_TRUE(m.ok()) << "degree " << degree << ": " << m.status();
    return m.ok() ? std::move(*m) : nullptr;
  }

  std::unique_ptr<Model> cpu_;
};

TEST_P(TpCudaBackendModelTest, LogitsEqualTheTensorParallelModelAtEveryStep) {
  for (int degree : TensorParallelPlan::ValidDegrees(cpu_->config())) {
    auto backend = Backend(degree);
    ASSERT_NE(backend, nullptr);
    TpCudaModelOptions o;
    o.degree = degree;
    auto model = TpCudaModel::Create(*cpu_, o);
    ASSERT_TRUE(model.ok()) << model.status();
    int prompt_index = 0;
    for (const std::vector<int32_t>& prompt : CudaCasePrompts()) {
      std::vector<std::vector<float>> want;
      auto ids = (*model)->Generate(prompt, kSteps, 0, &want);
      ASSERT_TRUE(ids.ok()) << ids.status();
      const std::vector<std::vector<float>> got =
          BackendGreedy(*backend, prompt, kSteps);
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(got[i].size(), want[i].size());
        EXPECT_TRUE(SameBits(got[i].data(), want[i].data(), got[i].size()))
            << "degree " << degree << ", prompt " << prompt_index << ", step "
            << i;
      }
      ++prompt_index;
    }
    std::printf(
        "[ %s tp-backend ] TP %d == TpCudaModel: %d prompts x %lld steps\n",
        GetParam().c_str(), degree, prompt_index,
        static_cast<long long>(kSteps));
  }
}

TEST_P(TpCudaBackendModelTest, DegreeOneIsTheSingleGpuBackend) {
  auto tp = Backend(1);
  ASSERT_NE(tp, nullptr);
  auto single = CudaBackendModel::Create(*cpu_);
  ASSERT_TRUE(single.ok()) << single.status();
  EXPECT_EQ(tp->numerics_version(), (*single)->numerics_version());
  for (const std::vector<int32_t>& prompt : CudaCasePrompts()) {
    const auto got = BackendGreedy(*tp, prompt, kSteps);
    const auto want = BackendGreedy(**single, prompt, kSteps);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_TRUE(SameBits(got[i].data(), want[i].data(), got[i].size()))
          << "step " << i;
    }
  }
}

TEST_P(TpCudaBackendModelTest, SaysWhatItIsAndRefusesWhatItCannotRun) {
  auto tp = Backend(2);
  ASSERT_NE(tp, nullptr);
  EXPECT_STREQ(tp->backend_name(), "cuda-tp");
  EXPECT_EQ(tp->degree(), 2);
  EXPECT_EQ(tp->numerics_version(), CudaTpNumericsVersion(2));
  EXPECT_NE(tp->numerics_version(), kCudaNumericsVersion);
  EXPECT_TRUE(tp->BoundedHotWindowSupport().ok());

  // The pool's budget counts the whole model's rows, over the shards.
  KvBlockPool::Options po;
  po.budget_bytes = 64 * KvCache::RowBytes(cpu_->config(), Precision::kBf16) *
                    2 * KvBlockPool::kDefaultBlockRows;
  auto pool = tp->NewBlockPool(po);
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_EQ((*pool)->capacity_blocks(), 64);
  EXPECT_FALSE((*pool)->host_accessible());

  // Pools of the CPU and of the single-GPU backend hold no shard slabs.
  auto host = KvBlockPool::Create(
      KvCache::RowBytes(cpu_->config(), Precision::kBf16), {});
  ASSERT_TRUE(host.ok());
  EXPECT_EQ(tp->NewCache(host->get()).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto single = CudaBackendModel::Create(*cpu_);
  ASSERT_TRUE(single.ok());
  auto single_pool = (*single)->NewBlockPool({});
  ASSERT_TRUE(single_pool.ok());
  EXPECT_EQ(tp->NewCache(single_pool->get()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(tp->NewCache(nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  // ... nor does another TP backend's pool.
  auto other = Backend(2);
  ASSERT_NE(other, nullptr);
  auto other_pool = other->NewBlockPool({});
  ASSERT_TRUE(other_pool.ok());
  EXPECT_EQ(tp->NewCache(other_pool->get()).status().code(),
            absl::StatusCode::kInvalidArgument);

  TpCudaBackendOptions three;
  three.degree = 3;  // 2 K/V heads
  EXPECT_EQ(TpCudaBackendModel::Create(*cpu_, three).status().code(),
            absl::StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Families, TpCudaBackendModelTest,
                         ::testing::Values("llama", "qwen2"));

}  // namespace
}  // namespace kvd::ops
