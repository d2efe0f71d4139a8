#include "services/collective/ordered_all_reduce.h"

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "services/transport/loopback_transport.h"
#include "services/transport/ucx_transport.h"

namespace kvd::collective {
namespace {

std::unique_ptr<transport::Transport> MakeTransport(const std::string& kind) {
  if (kind == "loopback") {
    return std::make_unique<transport::LoopbackTransport>();
  }
  transport::UcxOptions o;
  o.tls = kind;
  o.send_timeout = absl::Seconds(5);
  absl::StatusOr<std::unique_ptr<transport::UcxTransport>> ucx =
      transport::UcxTransport::Create(o);
  EXPECT_TRUE(ucx.ok()) << ucx.status();
  return ucx.ok() ? std::move(*ucx) : nullptr;
}

// `size` ranks over one transport, connected to each other.
std::vector<std::unique_ptr<OrderedAllReduce>> Ranks(transport::Transport* t,
                                                     int size) {
  std::vector<std::unique_ptr<OrderedAllReduce>> ranks;
  for (int r = 0; r < size; ++r) {
    absl::StatusOr<std::unique_ptr<OrderedAllReduce>> ar =
        OrderedAllReduce::Create(t, r, size);
    EXPECT_TRUE(ar.ok()) << ar.status();
    ranks.push_back(*std::move(ar));
  }
  for (int r = 0; r < size; ++r) {
    std::vector<std::string> inboxes(size);
    for (int p = 0; p < size; ++p) {
      if (p != r) inboxes[p] = ranks[p]->InboxFor(r);
    }
    EXPECT_TRUE(ranks[r]->Connect(inboxes).ok());
  }
  return ranks;
}

class OrderedAllReduceTest : public ::testing::TestWithParam<std::string> {};

// Every rank gets the partials of all ranks added in rank order, each rank's
// in its own order, bit for bit; many reduces in a row (as the layers of a
// forward pass) and sizes from one float to prefill-sized blocks.
TEST_P(OrderedAllReduceTest, EveryRankGetsTheSameOrderedSum) {
  constexpr int kSize = 3, kParts = 2;
  std::unique_ptr<transport::Transport> t = MakeTransport(GetParam());
  ASSERT_NE(t, nullptr);
  std::vector<std::unique_ptr<OrderedAllReduce>> ranks = Ranks(t.get(), kSize);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1e3f, 1e3f);
  for (int64_t n : {int64_t{1}, int64_t{576}, int64_t{40 * 576}}) {
    for (int round = 0; round < 5; ++round) {
      std::vector<std::vector<std::vector<float>>> parts(
          kSize,
          std::vector<std::vector<float>>(kParts, std::vector<float>(n)));
      for (auto& r : parts)
        for (auto& p : r)
          for (float& x : p) x = u(rng);
      std::vector<float> want(n);
      for (int64_t j = 0; j < n; ++j) {
        float s = parts[0][0][j];
        for (int r = 0; r < kSize; ++r)
          for (int i = 0; i < kParts; ++i)
            if (r + i > 0) s += parts[r][i][j];
        want[j] = s;
      }
      std::vector<std::vector<float>> got(kSize, std::vector<float>(n));
      std::vector<absl::Status> status(kSize);
      std::vector<std::thread> threads;
      for (int r = 0; r < kSize; ++r) {
        threads.emplace_back([&, r] {
          std::vector<const float*> mine;
          for (const auto& p : parts[r]) mine.push_back(p.data());
          status[r] = ranks[r]->Reduce(mine, n, got[r].data(),
                                       absl::Now() + absl::Seconds(30));
        });
      }
      for (auto& th : threads) th.join();
      for (int r = 0; r < kSize; ++r) {
        ASSERT_TRUE(status[r].ok()) << status[r];
        EXPECT_EQ(std::memcmp(got[r].data(), want.data(), n * 4), 0)
            << "rank " << r << ", n " << n << ", round " << round;
      }
    }
  }
}

// A rank that is gone fails its peers' Reduce (no hang), and they stay failed.
TEST_P(OrderedAllReduceTest, APeerThatDiesFailsTheReduce) {
  std::unique_ptr<transport::Transport> t = MakeTransport(GetParam());
  ASSERT_NE(t, nullptr);
  std::vector<std::unique_ptr<OrderedAllReduce>> ranks = Ranks(t.get(), 2);
  ranks[1].reset();  // its streams close
  const float x = 1;
  const float* parts[] = {&x};
  float out = 0;
  absl::Status s =
      ranks[0]->Reduce(parts, 1, &out, absl::Now() + absl::Seconds(3));
  EXPECT_FALSE(s.ok());
  EXPECT_FALSE(
      ranks[0]->Reduce(parts, 1, &out, absl::Now() + absl::Seconds(3)).ok());
}

INSTANTIATE_TEST_SUITE_P(Transports, OrderedAllReduceTest,
                         ::testing::Values("loopback", "tcp"));

}  // namespace
}  // namespace kvd::collective
