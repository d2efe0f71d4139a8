// Every Transport behaves the same at its edges: loopback (in process) and
// UCX over TCP and over shared memory, each a real UCP worker pair.
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "services/transport/chunk_stream.h"
#include "services/transport/loopback_transport.h"
#include "services/transport/ucx_transport.h"

namespace kvd::transport {
namespace {

std::unique_ptr<Transport> Make(const std::string& which) {
  if (which == "loopback") return std::make_unique<LoopbackTransport>();
  absl::StatusOr<std::unique_ptr<UcxTransport>> ucx =
      UcxTransport::Create({.tls = which == "ucx_tcp" ? "tcp" : "sm"});
  EXPECT_TRUE(ucx.ok()) << ucx.status();
  return ucx.ok() ? std::move(*ucx) : nullptr;
}

std::string Pattern(size_t n, int seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(i * 31 + seed);
  return s;
}

class TransportTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    transport_ = Make(GetParam());
    ASSERT_NE(transport_, nullptr);
  }
  std::unique_ptr<Transport> transport_;
};

TEST_P(TransportTest, ChunksArriveWholeAndInOrderThenTheEnd) {
  auto in = transport_->Listen({.max_chunk_bytes = 8 << 20});
  ASSERT_TRUE(in.ok()) << in.status();
  // Empty, tiny, eager-sized and rendezvous-sized chunks.
  const std::vector<size_t> sizes = {0, 1, 100, 8000, 1 << 20, 5 << 20, 3};
  std::thread sender([&] {
    auto out = transport_->Connect((*in)->address());
    ASSERT_TRUE(out.ok()) << out.status();
    for (size_t i = 0; i < sizes.size(); ++i) {
      ASSERT_TRUE((*out)->Send(Pattern(sizes[i], i)).ok());
    }
    ASSERT_TRUE((*out)->Close().ok());
  });
  std::string chunk;
  for (size_t i = 0; i < sizes.size(); ++i) {
    absl::StatusOr<bool> more =
        (*in)->Receive(&chunk, absl::Now() + absl::Seconds(20));
    ASSERT_TRUE(more.ok()) << more.status();
    ASSERT_TRUE(*more);
    EXPECT_EQ(chunk, Pattern(sizes[i], i)) << "chunk " << i;
  }
  absl::StatusOr<bool> end =
      (*in)->Receive(&chunk, absl::Now() + absl::Seconds(20));
  ASSERT_TRUE(end.ok()) << end.status();
  EXPECT_FALSE(*end);
  sender.join();
}

TEST_P(TransportTest, AChunkOverTheLimitIsRefusedBeforeItIsReceived) {
  auto in = transport_->Listen({.max_chunk_bytes = 1000});
  ASSERT_TRUE(in.ok());
  // Taken here: the receiver goes away below while the sender may still run.
  const std::string address = (*in)->address();
  std::thread sender([&] {
    auto out = transport_->Connect(address);
    ASSERT_TRUE(out.ok());
    // The receiver refuses it; the send may then fail or time out, but the
    // receiver must not allocate or deliver it.
    (*out)->Send(std::string(1001, 'x')).IgnoreError();
  });
  std::string chunk;
  absl::StatusOr<bool> got =
      (*in)->Receive(&chunk, absl::Now() + absl::Seconds(20));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kResourceExhausted)
      << got.status();
  EXPECT_TRUE(chunk.empty());
  in->reset();  // the receiver goes away: the sender gives up
  sender.join();
}

TEST_P(TransportTest, NothingArrivingEndsAtTheDeadline) {
  auto in = transport_->Listen({});
  ASSERT_TRUE(in.ok());
  std::string chunk;
  absl::StatusOr<bool> got =
      (*in)->Receive(&chunk, absl::Now() + absl::Milliseconds(200));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST_P(TransportTest, CancelEndsAWaitingReceive) {
  auto in = transport_->Listen({});
  ASSERT_TRUE(in.ok());
  std::thread canceller([&] {
    absl::SleepFor(absl::Milliseconds(100));
    (*in)->Cancel();
  });
  std::string chunk;
  const absl::Time start = absl::Now();
  absl::StatusOr<bool> got =
      (*in)->Receive(&chunk, absl::Now() + absl::Seconds(30));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kCancelled);
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
  canceller.join();
}

TEST_P(TransportTest, AnAddressThatIsNotOneIsRefused) {
  EXPECT_FALSE(transport_->Connect("").ok());
}

INSTANTIATE_TEST_SUITE_P(Transports, TransportTest,
                         ::testing::Values("loopback", "ucx_tcp", "ucx_sm"));

TEST(LoopbackTransportTest, ASenderGoneWithoutCloseBreaksTheStream) {
  LoopbackTransport t;
  auto in = t.Listen({});
  ASSERT_TRUE(in.ok());
  {
    auto out = t.Connect((*in)->address());
    ASSERT_TRUE(out.ok());
    ASSERT_TRUE((*out)->Send("a").ok());
  }
  std::string chunk;
  ASSERT_TRUE(*(*in)->Receive(&chunk, absl::Now() + absl::Seconds(1)));
  EXPECT_EQ(
      (*in)->Receive(&chunk, absl::Now() + absl::Seconds(1)).status().code(),
      absl::StatusCode::kUnavailable);
}

TEST(UcxTransportTest, UnknownTransportNamesAreRefused) {
  auto ucx = UcxTransport::Create({.tls = "no-such-transport"});
  EXPECT_FALSE(ucx.ok());
}

}  // namespace
}  // namespace kvd::transport
