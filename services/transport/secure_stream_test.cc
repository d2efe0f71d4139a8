// The secure framing over real streams: a transfer arrives whole only when
// the sender holds the transfer's secret and the stream is intact; every
// injected fault and every wrong secret aborts it, and no damaged payload is
// ever handed out.
#include "services/transport/secure_stream.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "services/transport/fault_injecting_transport.h"
#include "services/transport/loopback_transport.h"
#include "services/transport/ucx_transport.h"

namespace kvd::transport {
namespace {

std::vector<std::string> Payloads() {
  std::vector<std::string> out;
  for (int i = 0; i < 6; ++i) {
    std::string p(1000 * (i + 1) + (i == 3 ? 300000 : 0), '\0');
    for (size_t j = 0; j < p.size(); ++j) p[j] = static_cast<char>(i + j * 7);
    out.push_back(std::move(p));
  }
  return out;
}

struct Outcome {
  absl::Status sender;
  absl::Status receiver;              // OK when the end frame verified
  std::vector<std::string> received;  // payloads handed out
};

// Sends Payloads() through `send_via` to a receiver of `listen_on` that
// expects `receiver_secret`; the sender uses `sender_secret`.
Outcome Transfer(Transport* listen_on, Transport* send_via,
                 const TransferSecret& receiver_secret,
                 const TransferSecret& sender_secret) {
  Outcome o;
  auto inner = listen_on->Listen({.max_chunk_bytes = 1 << 20});
  EXPECT_TRUE(inner.ok()) << inner.status();
  auto in =
      std::make_unique<SecureReceiver>(std::move(*inner), receiver_secret);
  const std::string address = in->address();
  std::thread sender([&] {
    auto out = send_via->Connect(address);
    if (!out.ok()) {
      o.sender = out.status();
      return;
    }
    auto secure = SecureSender::Start(std::move(*out), sender_secret);
    if (!secure.ok()) {
      o.sender = secure.status();
      return;
    }
    for (const std::string& p : Payloads()) {
      o.sender = (*secure)->Send(p);
      if (!o.sender.ok()) return;
    }
    o.sender = (*secure)->Finish();
  });
  std::string payload;
  for (;;) {
    absl::StatusOr<bool> more =
        in->Receive(&payload, absl::Now() + absl::Seconds(3));
    if (!more.ok()) {
      o.receiver = more.status();
      in.reset();  // as a node does: the sender's endpoint then fails
      break;
    }
    if (!*more) break;
    o.received.push_back(payload);
  }
  sender.join();
  return o;
}

class SecureStreamTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "loopback") {
      transport_ = std::make_unique<LoopbackTransport>();
    } else {
      auto ucx =
          UcxTransport::Create({.tls = GetParam() == "ucx_tcp" ? "tcp" : "sm",
                                .send_timeout = absl::Seconds(1)});
      ASSERT_TRUE(ucx.ok()) << ucx.status();
      transport_ = std::move(*ucx);
    }
  }
  std::unique_ptr<Transport> transport_;
};

TEST_P(SecureStreamTest, TheRightSecretGetsEveryPayloadThrough) {
  const TransferSecret secret = TransferSecret::New();
  Outcome o = Transfer(transport_.get(), transport_.get(), secret, secret);
  ASSERT_TRUE(o.sender.ok()) << o.sender;
  ASSERT_TRUE(o.receiver.ok()) << o.receiver;
  EXPECT_EQ(o.received, Payloads());
}

TEST_P(SecureStreamTest, AWrongKeyIsRefusedAtTheFirstFrame) {
  const TransferSecret secret = TransferSecret::New();
  TransferSecret forged = secret;
  forged.key[0] ^= 1;
  Outcome o = Transfer(transport_.get(), transport_.get(), secret, forged);
  EXPECT_EQ(o.receiver.code(), absl::StatusCode::kPermissionDenied)
      << o.receiver;
  EXPECT_TRUE(o.received.empty());
}

TEST_P(SecureStreamTest, AWrongTokenIsRefused) {
  const TransferSecret secret = TransferSecret::New();
  TransferSecret other = secret;
  other.token = TransferSecret::New().token;
  Outcome o = Transfer(transport_.get(), transport_.get(), secret, other);
  EXPECT_EQ(o.receiver.code(), absl::StatusCode::kPermissionDenied)
      << o.receiver;
  EXPECT_TRUE(o.received.empty());
}

TEST_P(SecureStreamTest, EveryInjectedFaultAbortsTheTransfer) {
  // Frame 0 is the token, 1..6 the payloads, 7 the end frame.
  const std::vector<FaultSpec> faults = {
      {Fault::kDrop, 2},       {Fault::kDrop, 7},      {Fault::kTruncate, 0},
      {Fault::kTruncate, 4},   {Fault::kTruncate, 7},  {Fault::kFlipByte, 0},
      {Fault::kFlipByte, 4},   {Fault::kFlipByte, 7},  {Fault::kDisconnect, 3},
      {Fault::kDisconnect, 7}, {Fault::kDuplicate, 2}, {Fault::kDuplicate, 7},
  };
  const std::vector<std::string> sent = Payloads();
  for (const FaultSpec& f : faults) {
    SCOPED_TRACE(FaultName(f));
    FaultInjectingTransport faulty(transport_.get(), f);
    const TransferSecret secret = TransferSecret::New();
    Outcome o = Transfer(transport_.get(), &faulty, secret, secret);
    EXPECT_FALSE(o.receiver.ok());
    // What was handed out before the fault is exactly what was sent.
    ASSERT_LE(o.received.size(), sent.size());
    for (size_t i = 0; i < o.received.size(); ++i) {
      EXPECT_EQ(o.received[i], sent[i]);
    }
  }
}

TEST_P(SecureStreamTest, ADelayedStreamStillArrivesWhole) {
  FaultInjectingTransport slow(transport_.get(),
                               {Fault::kDelay, 0, absl::Milliseconds(20)});
  const TransferSecret secret = TransferSecret::New();
  Outcome o = Transfer(transport_.get(), &slow, secret, secret);
  ASSERT_TRUE(o.receiver.ok()) << o.receiver;
  EXPECT_EQ(o.received, Payloads());
}

TEST_P(SecureStreamTest, ACaptureOfTheWireShowsNoPayloadInTheClear) {
  // A session's token ids as a checkpoint stores them (int32, little
  // endian), then the frames as they cross the wire, taken by a plain
  // receiver in the peer's place.
  std::string ids;
  for (int32_t id = 1000; id < 3000; ++id) {
    ids.append(reinterpret_cast<const char*>(&id), sizeof(id));
  }
  auto raw = transport_->Listen({.max_chunk_bytes = 1 << 20});
  ASSERT_TRUE(raw.ok()) << raw.status();
  const TransferSecret secret = TransferSecret::New();
  std::thread sender([&] {
    auto out = transport_->Connect((*raw)->address());
    ASSERT_TRUE(out.ok()) << out.status();
    auto secure = SecureSender::Start(std::move(*out), secret);
    ASSERT_TRUE(secure.ok()) << secure.status();
    EXPECT_TRUE((*secure)->Send(ids).ok());
    EXPECT_TRUE((*secure)->Finish().ok());
  });
  std::string wire, frame;
  for (;;) {
    absl::StatusOr<bool> more =
        (*raw)->Receive(&frame, absl::Now() + absl::Seconds(10));
    ASSERT_TRUE(more.ok()) << more.status();
    if (!*more) break;
    wire += frame;
  }
  sender.join();
  ASSERT_GE(wire.size(), ids.size());
  // No run of 4 token ids, anywhere in the payload, and not the one-time
  // token either.
  for (size_t at = 0; at + 16 <= ids.size(); at += 4) {
    ASSERT_EQ(wire.find(ids.substr(at, 16)), std::string::npos) << at;
  }
  EXPECT_EQ(wire.find(secret.token), std::string::npos);
  EXPECT_EQ(wire.find(secret.key), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Transports, SecureStreamTest,
                         ::testing::Values("loopback", "ucx_tcp", "ucx_sm"));

TEST(TransferSecretTest, SecretsAreFreshAndFullLength) {
  TransferSecret a = TransferSecret::New();
  TransferSecret b = TransferSecret::New();
  EXPECT_EQ(a.token.size(), kSecretBytes);
  EXPECT_EQ(a.key.size(), kSecretBytes);
  EXPECT_NE(a.token, b.token);
  EXPECT_NE(a.key, b.key);
  EXPECT_NE(a.token, a.key);
}

}  // namespace
}  // namespace kvd::transport
