// CPU tensor parallelism as processes, end to end: a ShardGroup (this
// process as shard 0) spawns real `kvd worker` processes, which meet over
// UCX (TCP on loopback). Its steps give the bits one process gives, at TP 2
// and 4 of a random-weight model with 8 K/V heads; a session rebuilt from
// its residual checkpoint on the group (each shard recomputing its heads'
// K/V from residuals the leader streams to it) continues exactly as the one
// process's; and a worker that is killed or hangs fails the step with
// UNAVAILABLE, after which the group restarts its workers and serves again
// with the same bits, refusing the K/V the dead workers held.
#include "services/worker/shard_group.h"

#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "ops/kvdirect/checkpoint_policy.h"
#include "ops/kvdirect/rebuild.h"
#include "ops/kvdirect/residual_store.h"
#include "ops/model/model.h"
#include "ops/model/testing/model_cases.h"
#include "ops/model/testing/tiny_model.h"

namespace kvd::worker {
namespace {

std::string KvdBinary() {
  return absl::StrCat(std::getenv("TEST_SRCDIR"), "/",
                      std::getenv("TEST_WORKSPACE"), "/tools/kvd/kvd");
}

// A random-weight model with 8 K/V heads (TP 1, 2, 4 and 8 divide it).
absl::StatusOr<std::string> EightHeadModel() {
  return ops::testing::WriteTinyModel(ops::testing::EightKvHeadSpec(),
                                      ::testing::TempDir());
}

struct Fixture {
  std::string path;
  std::unique_ptr<ops::Model> full;
};

Fixture Load(ops::Precision precision) {
  Fixture f;
  absl::StatusOr<std::string> path = EightHeadModel();
  EXPECT_TRUE(path.ok()) << path.status();
  f.path = *path;
  ops::LoadOptions lo;
  lo.precision = precision;
  lo.num_threads = 1;
  absl::StatusOr<std::unique_ptr<ops::Model>> m = ops::Model::Load(f.path, lo);
  EXPECT_TRUE(m.ok()) << m.status();
  f.full = *std::move(m);
  return f;
}

absl::StatusOr<std::unique_ptr<ShardGroup>> StartGroup(
    const Fixture& f, int degree, absl::Duration timeout = absl::Seconds(30)) {
  ShardGroupOptions o;
  o.model_path = f.path;
  o.degree = degree;
  o.threads_per_shard = 1;
  o.worker_binary = KvdBinary();
  o.timeout = timeout;
  return ShardGroup::Start(*f.full, o);
}

std::vector<float> Logits(const ops::ModelBackend& m) {
  const int64_t vocab = m.config().vocab_size;
  absl::StatusOr<std::vector<float>> got = ops::testing::LastLogitsPerStep(
      m, ops::testing::RandomTokens(45, 1, vocab),
      ops::testing::RandomTokens(5, 2, vocab));
  EXPECT_TRUE(got.ok()) << got.status();
  return got.ok() ? *got : std::vector<float>();
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return !a.empty() && a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(ShardGroup, StepsGiveOneProcesssBitsAtTp2And4) {
  for (ops::Precision precision :
       {ops::Precision::kF32, ops::Precision::kBf16}) {
    Fixture f = Load(precision);
    const std::vector<float> want = Logits(*f.full);
    for (int degree : {2, 4}) {
      absl::StatusOr<std::unique_ptr<ShardGroup>> group = StartGroup(f, degree);
      ASSERT_TRUE(group.ok()) << group.status();
      EXPECT_EQ((*group)->workers().size(), degree - 1);
      EXPECT_TRUE(SameBits(Logits(**group), want))
          << ops::PrecisionName(precision) << " TP=" << degree
          << ": the shard group's logits differ from one process's";
    }
  }
}

TEST(ShardGroup, RefusesADegreeThatDoesNotDivideTheModel) {
  Fixture f = Load(ops::Precision::kF32);
  absl::StatusOr<std::unique_ptr<ShardGroup>> group = StartGroup(f, 3);
  ASSERT_FALSE(group.ok());
  EXPECT_EQ(group.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(group.status().message().find("2, 4, 8"), std::string::npos)
      << group.status();
}

// Runs `tokens` through `m` in one cache and returns the last logits of
// each of `decode` single-token steps after them.
std::vector<float> Continue(const ops::ModelBackend& m, ops::KvCache* cache,
                            const std::vector<int32_t>& decode) {
  std::vector<float> out;
  const int64_t vocab = m.config().vocab_size;
  for (int32_t t : decode) {
    ops::SequenceStep s{cache, absl::MakeConstSpan(&t, 1),
                        ops::LogitsMode::kLast};
    ops::ForwardOutput o;
    absl::Status st = m.Forward({&s, 1}, &o);
    EXPECT_TRUE(st.ok()) << st;
    if (!st.ok()) return {};
    out.insert(out.end(), o.Logits(0), o.Logits(0) + vocab);
  }
  return out;
}

// A session checkpointed by one process (its residuals) is rebuilt on the
// shard group, every shard recomputing its own heads, and continues with
// one process's bits: kv-direct (RecomputeKvIntoCache on every shard) and
// stride:2 (partial prefills, ForwardLayers on every shard).
TEST(ShardGroup, ASessionRebuiltFromResidualsContinuesExactly) {
  Fixture f = Load(ops::Precision::kBf16);
  const int64_t vocab = f.full->config().vocab_size;
  const std::vector<int32_t> history =
      ops::testing::RandomTokens(150, 3, vocab);
  const std::vector<int32_t> decode = ops::testing::RandomTokens(4, 4, vocab);
  absl::StatusOr<std::unique_ptr<ShardGroup>> group = StartGroup(f, 4);
  ASSERT_TRUE(group.ok()) << group.status();
  for (const char* name : {"kv-direct", "stride:2"}) {
    absl::StatusOr<ops::CheckpointPolicy> policy =
        ops::ParseCheckpointPolicy(name);
    ASSERT_TRUE(policy.ok());
    // The one-process session: its checkpoint and its continuation.
    ops::ResidualStore checkpoint(
        f.full->config(), f.full->precision(),
        ops::CheckpointLayers(*policy, f.full->config().n_layers));
    ops::KvCache one = f.full->NewCache();
    ops::SequenceStep prefill{&one, history, ops::LogitsMode::kNone};
    ops::ForwardOutput o;
    ASSERT_TRUE(f.full->Forward({&prefill, 1}, &o, &checkpoint).ok());
    const std::vector<float> want = Continue(*f.full, &one, decode);

    absl::StatusOr<std::unique_ptr<ops::KvBlockPool>> pool =
        (*group)->NewBlockPool({});
    ASSERT_TRUE(pool.ok());
    absl::StatusOr<ops::KvCache> cache = (*group)->NewCache(pool->get());
    ASSERT_TRUE(cache.ok());
    ops::RebuildSpec spec;
    spec.policy = *policy;
    spec.tokens = history;
    spec.checkpoint = &checkpoint;
    spec.block = 64;
    ASSERT_TRUE(ops::RebuildKv(**group, spec, &*cache, nullptr).ok());
    EXPECT_TRUE(SameBits(Continue(**group, &*cache, decode), want))
        << name << ": the rebuilt session diverged on the shard group";
  }
  // Every worker was sent residuals and recomputed rows from them.
  for (const ShardWorkerInfo& w : (*group)->workers()) {
    EXPECT_GT(w.stats.residual_bytes_received(), 0) << "rank " << w.rank;
    EXPECT_GT(w.stats.rows_recomputed(), 0) << "rank " << w.rank;
  }
}

// A worker killed (kill -9) or hung (SIGSTOP) between steps: the next step
// fails with UNAVAILABLE, the group restarts its workers, a sequence whose
// K/V the old workers held is refused (UNAVAILABLE: resume it), and an
// emptied or new one runs with one process's bits.
TEST(ShardGroup, ADeadOrHungWorkerFailsTheStepAndTheGroupRestarts) {
  Fixture f = Load(ops::Precision::kF32);
  const std::vector<float> want = Logits(*f.full);
  const int64_t vocab = f.full->config().vocab_size;
  for (int sig : {SIGKILL, SIGSTOP}) {
    absl::StatusOr<std::unique_ptr<ShardGroup>> group =
        StartGroup(f, 2, absl::Seconds(3));
    ASSERT_TRUE(group.ok()) << group.status();
    absl::StatusOr<std::unique_ptr<ops::KvBlockPool>> pool =
        (*group)->NewBlockPool({});
    ASSERT_TRUE(pool.ok());
    absl::StatusOr<ops::KvCache> cache = (*group)->NewCache(pool->get());
    ASSERT_TRUE(cache.ok());
    const std::vector<int32_t> prompt =
        ops::testing::RandomTokens(20, 5, vocab);
    ops::SequenceStep step{&*cache, prompt, ops::LogitsMode::kLast};
    ops::ForwardOutput o;
    ASSERT_TRUE((*group)->Forward({&step, 1}, &o).ok());

    const pid_t victim = (*group)->workers().at(0).pid;
    ASSERT_EQ(kill(victim, sig), 0);
    const int32_t next = 7;
    ops::SequenceStep decode{&*cache, absl::MakeConstSpan(&next, 1),
                             ops::LogitsMode::kLast};
    const auto start = std::chrono::steady_clock::now();
    absl::Status failed = (*group)->Forward({&decode, 1}, &o);
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    EXPECT_EQ(failed.code(), absl::StatusCode::kUnavailable) << failed;
    EXPECT_LT(took, 30) << "the leader waited far past the 3 s timeout";

    // Restarted on the next call; this sequence's rows died with the old
    // workers.
    absl::Status stale = (*group)->Forward({&decode, 1}, &o);
    EXPECT_EQ(stale.code(), absl::StatusCode::kUnavailable) << stale;
    EXPECT_EQ((*group)->restarts(), 1);
    ASSERT_EQ((*group)->workers().size(), 1u);
    EXPECT_NE((*group)->workers()[0].pid, victim);

    // Emptied, it runs again; a new sequence runs; both exactly.
    cache->Reset(0);
    ASSERT_TRUE((*group)->Forward({&step, 1}, &o).ok());
    EXPECT_TRUE(SameBits(Logits(**group), want))
        << "after a restart (signal " << sig << ")";
  }
}

}  // namespace
}  // namespace kvd::worker
