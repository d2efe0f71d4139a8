// Tensor-parallel shards as separate processes on the CPU: each process
// loads the model, keeps its shard (Model::ShardOf), and joins the others'
// row-parallel partials through the ordered all-reduce over UCX (TCP on
// loopback). Every process's logits equal one unsharded process's bit for
// bit: a random-weight model with 8 K/V heads at TP = 2 and 4, and
// SmolLM2-135M at TP = 3.
//
// The shard processes are forked before anything starts a thread; they meet
// by writing their UCX inbox addresses to files in TEST_TMPDIR (a node's
// leader hands them over its control channel instead).
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "base/model_dir.h"
#include "gtest/gtest.h"
#include "ops/model/model.h"
#include "ops/model/testing/model_cases.h"
#include "ops/model/testing/tiny_model.h"
#include "services/collective/ordered_all_reduce.h"
#include "services/transport/ucx_transport.h"
#include "services/worker/collective_shard_reducer.h"

namespace kvd::worker {
namespace {

// Every step's last logits of the fixed conversation all shards run.
absl::StatusOr<std::vector<float>> RunSteps(const ops::Model& m) {
  const int64_t vocab = m.config().vocab_size;
  return ops::testing::LastLogitsPerStep(
      m, ops::testing::RandomTokens(33, 1, vocab),
      ops::testing::RandomTokens(4, 2, vocab));
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteFileAtomically(const std::string& path, const std::string& data) {
  const std::string tmp = path + ".tmp";
  std::ofstream(tmp, std::ios::binary) << data;
  std::filesystem::rename(tmp, path);
}

// One shard process: rank `rank` of `degree`; writes its logits to
// dir/logits-RANK. Returns what went wrong, if anything.
// `timeout`: how long a reduce waits for its peers. `die`: exit as soon as
// connected, as a shard process killed before the turn would.
absl::Status Shard(const std::string& model_path, ops::Precision precision,
                   int rank, int degree, const std::string& dir,
                   absl::Duration timeout = absl::Seconds(60),
                   bool die = false) {
  transport::UcxOptions uo;
  uo.tls = "tcp";
  uo.send_timeout = timeout;
  absl::StatusOr<std::unique_ptr<transport::UcxTransport>> ucx =
      transport::UcxTransport::Create(uo);
  if (!ucx.ok()) return ucx.status();
  absl::StatusOr<std::unique_ptr<collective::OrderedAllReduce>> ar =
      collective::OrderedAllReduce::Create(ucx->get(), rank, degree);
  if (!ar.ok()) return ar.status();
  for (int p = 0; p < degree; ++p) {
    if (p == rank) continue;
    WriteFileAtomically(absl::StrCat(dir, "/inbox-", rank, "-to-", p),
                        absl::BytesToHexString((*ar)->InboxFor(p)));
  }
  std::vector<std::string> inboxes(degree);
  const auto give_up =
      std::chrono::steady_clock::now() + std::chrono::seconds(120);
  for (int p = 0; p < degree; ++p) {
    if (p == rank) continue;
    const std::string path = absl::StrCat(dir, "/inbox-", p, "-to-", rank);
    while (!std::filesystem::exists(path)) {
      if (std::chrono::steady_clock::now() > give_up) {
        return absl::DeadlineExceededError("no inbox from rank " +
                                           std::to_string(p));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    inboxes[p] = absl::HexStringToBytes(ReadFile(path));
  }
  if (absl::Status s = (*ar)->Connect(inboxes); !s.ok()) return s;
  WriteFileAtomically(absl::StrCat(dir, "/connected-", rank), "");
  if (die) {
    // Once every peer is connected too, so that they meet the death in
    // their forward pass, not while connecting.
    for (int p = 0; p < degree; ++p) {
      while (p != rank &&
             !std::filesystem::exists(absl::StrCat(dir, "/connected-", p))) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
    _exit(0);
  }

  ops::LoadOptions lo;
  lo.precision = precision;
  lo.num_threads = 1;
  absl::StatusOr<std::unique_ptr<ops::Model>> full =
      ops::Model::Load(model_path, lo);
  if (!full.ok()) return full.status();
  CollectiveShardReducer reducer(ar->get(), timeout);
  absl::StatusOr<std::unique_ptr<ops::Model>> shard =
      ops::Model::ShardOf(**full, rank, degree, &reducer, 1);
  if (!shard.ok()) return shard.status();
  full->reset();  // a shard process keeps only its slice
  absl::StatusOr<std::vector<float>> logits = RunSteps(**shard);
  if (!logits.ok()) return logits.status();
  WriteFileAtomically(absl::StrCat(dir, "/logits-", rank),
                      std::string(reinterpret_cast<const char*>(logits->data()),
                                  logits->size() * sizeof(float)));
  return absl::OkStatus();
}

// Forks degree - 1 shard processes, runs rank 0 here, then the unsharded
// model, and compares every rank's logits with it.
void ExpectShardProcessesMatch(const std::string& model_path,
                               ops::Precision precision, int degree,
                               const std::string& name) {
  const std::string dir =
      absl::StrCat(::testing::TempDir(), "/", name, "-tp", degree);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::vector<pid_t> children;
  for (int rank = 1; rank < degree; ++rank) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      absl::Status s = Shard(model_path, precision, rank, degree, dir);
      if (!s.ok())
        std::fprintf(stderr, "shard %d: %s\n", rank, s.ToString().c_str());
      std::fflush(stderr);
      _exit(s.ok() ? 0 : 1);
    }
    children.push_back(pid);
  }
  absl::Status mine = Shard(model_path, precision, 0, degree, dir);
  EXPECT_TRUE(mine.ok()) << mine;
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "a shard process failed (its message is above)";
  }
  ops::LoadOptions lo;
  lo.precision = precision;
  lo.num_threads = 1;
  absl::StatusOr<std::unique_ptr<ops::Model>> full =
      ops::Model::Load(model_path, lo);
  ASSERT_TRUE(full.ok()) << full.status();
  absl::StatusOr<std::vector<float>> want = RunSteps(**full);
  ASSERT_TRUE(want.ok()) << want.status();
  for (int rank = 0; rank < degree; ++rank) {
    const std::string got = ReadFile(absl::StrCat(dir, "/logits-", rank));
    ASSERT_EQ(got.size(), want->size() * sizeof(float)) << "rank " << rank;
    EXPECT_EQ(std::memcmp(got.data(), want->data(), got.size()), 0)
        << name << " TP=" << degree << ": rank " << rank
        << "'s logits differ from one process's";
  }
}

// A random-weight model with 8 K/V heads: TP 1, 2, 4 and 8 are possible.
absl::StatusOr<std::string> WriteEightHeadModel() {
  return ops::testing::WriteTinyModel(ops::testing::EightKvHeadSpec(),
                                      ::testing::TempDir());
}

TEST(ShardProcesses, TinyModelAtTp2And4) {
  absl::StatusOr<std::string> path = WriteEightHeadModel();
  ASSERT_TRUE(path.ok()) << path.status();
  for (int degree : {2, 4}) {
    ExpectShardProcessesMatch(*path, ops::Precision::kF32, degree, "tiny");
  }
}

// A shard process that dies fails the others' forward pass within the
// reduce timeout, with an error naming the collective, instead of hanging or
// answering with a partial sum.
TEST(ShardProcesses, ADeadShardFailsTheForwardPass) {
  absl::StatusOr<std::string> path = WriteEightHeadModel();
  ASSERT_TRUE(path.ok()) << path.status();
  const std::string dir = ::testing::TempDir() + "/dead-shard";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    (void)Shard(*path, ops::Precision::kF32, 1, 2, dir, absl::Seconds(3),
                /*die=*/true);
    _exit(1);  // not reached: the shard exits once connected
  }
  const auto start = std::chrono::steady_clock::now();
  absl::Status mine =
      Shard(*path, ops::Precision::kF32, 0, 2, dir, absl::Seconds(3));
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_FALSE(mine.ok()) << "a forward pass without its peer succeeded";
  // The forward pass's reduce failed (not the connection: both connected).
  EXPECT_NE(mine.message().find("rank 1"), std::string::npos) << mine;
  EXPECT_EQ(mine.message().find("cannot reach"), std::string::npos) << mine;
  EXPECT_LT(took, 60) << "the surviving shard hung";
  EXPECT_FALSE(std::filesystem::exists(dir + "/logits-0"));
}

TEST(ShardProcesses, SmolLm2AtTp3) {
  ExpectShardProcessesMatch(CachedModelPath("SmolLM2-135M-Instruct.Q4_1.gguf"),
                            ops::Precision::kBf16, 3, "smollm2");
}

}  // namespace
}  // namespace kvd::worker
