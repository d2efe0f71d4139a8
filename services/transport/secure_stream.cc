#include "services/transport/secure_stream.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/base/internal/endian.h"
#include "absl/strings/str_cat.h"

namespace kvd::transport {
namespace {

constexpr size_t kMacBytes = 32;
constexpr size_t kHeaderBytes = 1 + 8;

std::string RandomBytes(size_t n) {
  std::string out(n, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(out.data()),
                 static_cast<int>(n)) != 1) {
    // No randomness means no secret: never fall back to a guessable one.
    std::abort();
  }
  return out;
}

// HMAC-SHA256 of `data` under `key` into `out` (kMacBytes).
void Mac(const std::string& key, absl::string_view data, unsigned char* out) {
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), out,
       &len);
}

absl::Status CheckSecret(const TransferSecret& s) {
  if (s.token.size() != kSecretBytes || s.mac_key.size() != kSecretBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a transfer secret is a ", kSecretBytes,
                     "-byte token and a ", kSecretBytes, "-byte MAC key"));
  }
  return absl::OkStatus();
}

}  // namespace

TransferSecret TransferSecret::New() {
  return TransferSecret{RandomBytes(kSecretBytes), RandomBytes(kSecretBytes)};
}

absl::StatusOr<std::unique_ptr<SecureSender>> SecureSender::Start(
    std::unique_ptr<ChunkSender> inner, const TransferSecret& secret) {
  if (absl::Status ok = CheckSecret(secret); !ok.ok()) return ok;
  auto sender =
      std::unique_ptr<SecureSender>(new SecureSender(std::move(inner), secret));
  if (absl::Status hello = sender->SendFrame('H', secret.token); !hello.ok()) {
    return hello;
  }
  return sender;
}

absl::Status SecureSender::SendFrame(char kind, absl::string_view payload) {
  frame_.resize(kHeaderBytes + payload.size() + kMacBytes);
  frame_[0] = kind;
  absl::little_endian::Store64(&frame_[1], seq_);
  if (!payload.empty()) {
    std::memcpy(&frame_[kHeaderBytes], payload.data(), payload.size());
  }
  Mac(secret_.mac_key,
      absl::string_view(frame_.data(), kHeaderBytes + payload.size()),
      reinterpret_cast<unsigned char*>(&frame_[kHeaderBytes + payload.size()]));
  absl::Status sent = inner_->Send(frame_);
  if (!sent.ok()) return sent;
  seq_++;
  wire_bytes_ += static_cast<int64_t>(frame_.size());
  return absl::OkStatus();
}

absl::Status SecureSender::Send(absl::string_view payload) {
  absl::Status sent = SendFrame('D', payload);
  if (sent.ok()) {
    data_frames_++;
    payload_bytes_ += static_cast<int64_t>(payload.size());
  }
  return sent;
}

absl::Status SecureSender::Finish() {
  char count[8];
  absl::little_endian::Store64(count, data_frames_);
  absl::Status sent = SendFrame('E', absl::string_view(count, 8));
  if (!sent.ok()) return sent;
  return inner_->Close();
}

SecureReceiver::SecureReceiver(std::unique_ptr<ChunkReceiver> inner,
                               TransferSecret secret)
    : inner_(std::move(inner)), secret_(std::move(secret)) {
  failed_ = CheckSecret(secret_);
}

absl::StatusOr<bool> SecureReceiver::Receive(std::string* payload,
                                             absl::Time deadline) {
  if (!failed_.ok()) return failed_;
  if (ended_) return false;
  absl::StatusOr<bool> got = ReceiveFrame(payload, deadline);
  if (!got.ok()) {
    failed_ = got.status();
    inner_->Cancel();  // a failed transfer takes nothing more
  }
  return got;
}

absl::StatusOr<bool> SecureReceiver::ReceiveFrame(std::string* payload,
                                                  absl::Time deadline) {
  for (;;) {
    std::string& frame = *payload;
    absl::StatusOr<bool> more = inner_->Receive(&frame, deadline);
    if (!more.ok()) return more.status();
    if (!*more) {
      return absl::DataLossError(absl::StrCat(
          "the transfer stream ended after ", seq_,
          " frames without its end frame (cut short or truncated)"));
    }
    if (frame.size() < kHeaderBytes + kMacBytes) {
      return absl::DataLossError(absl::StrCat(
          "a transfer frame of ", frame.size(), " bytes is shorter than ",
          kHeaderBytes + kMacBytes, " (truncated)"));
    }
    const size_t body = frame.size() - kMacBytes;
    unsigned char mac[kMacBytes];
    Mac(secret_.mac_key, absl::string_view(frame.data(), body), mac);
    if (CRYPTO_memcmp(mac, frame.data() + body, kMacBytes) != 0) {
      return absl::PermissionDeniedError(absl::StrCat(
          "frame ", seq_,
          " of the transfer failed its HMAC-SHA256 check (damaged, or not "
          "sent by the peer this transfer was authorised for); transfer "
          "aborted"));
    }
    const char kind = frame[0];
    const uint64_t seq = absl::little_endian::Load64(&frame[1]);
    if (seq != seq_) {
      return absl::DataLossError(
          absl::StrCat("transfer frame ", seq, " arrived where frame ", seq_,
                       " was due (a frame was lost or repeated)"));
    }
    const size_t payload_size = body - kHeaderBytes;
    if (seq_ == 0) {
      if (kind != 'H' || payload_size != kSecretBytes ||
          CRYPTO_memcmp(frame.data() + kHeaderBytes, secret_.token.data(),
                        kSecretBytes) != 0) {
        return absl::PermissionDeniedError(
            "the transfer's first frame does not carry its one-time token");
      }
      seq_++;
      continue;
    }
    seq_++;
    if (kind == 'D') {
      std::memmove(frame.data(), frame.data() + kHeaderBytes, payload_size);
      frame.resize(payload_size);
      data_frames_++;
      payload_bytes_ += static_cast<int64_t>(payload_size);
      return true;
    }
    if (kind == 'E' && payload_size == 8) {
      const uint64_t count =
          absl::little_endian::Load64(frame.data() + kHeaderBytes);
      if (count != data_frames_) {
        return absl::DataLossError(
            absl::StrCat("the transfer's end frame counts ", count,
                         " data frames, ", data_frames_, " arrived"));
      }
      ended_ = true;
      // Anything after the end frame is an error; a clean close is not.
      std::string extra;
      absl::StatusOr<bool> after = inner_->Receive(&extra, deadline);
      if (!after.ok()) return after.status();
      if (*after) {
        return absl::DataLossError(
            "the transfer stream went on after its end frame");
      }
      payload->clear();
      return false;
    }
    return absl::DataLossError(
        absl::StrCat("transfer frame ", seq, " has an unknown kind ",
                     static_cast<int>(static_cast<unsigned char>(kind))));
  }
}

}  // namespace kvd::transport
