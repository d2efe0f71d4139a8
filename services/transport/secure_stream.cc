#include "services/transport/secure_stream.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/base/internal/endian.h"
#include "absl/strings/str_cat.h"

namespace kvd::transport {
namespace {

constexpr size_t kTagBytes = 16;
constexpr size_t kHeaderBytes = 1 + 8;
constexpr size_t kNonceBytes = 12;

std::string RandomBytes(size_t n) {
  std::string out(n, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(out.data()),
                 static_cast<int>(n)) != 1) {
    // No randomness means no secret: never fall back to a guessable one.
    std::abort();
  }
  return out;
}

absl::Status CheckSecret(const TransferSecret& s) {
  if (s.token.size() != kSecretBytes || s.key.size() != kSecretBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a transfer secret is a ", kSecretBytes,
                     "-byte token and a ", kSecretBytes, "-byte key"));
  }
  return absl::OkStatus();
}

// The frame's nonce: its sequence number, unique under the transfer's key
// (a key is drawn per transfer and a stream never repeats a number).
void Nonce(uint64_t seq, unsigned char* nonce) {
  std::memset(nonce, 0, kNonceBytes);
  absl::little_endian::Store64(nonce + kNonceBytes - 8, seq);
}

const unsigned char* Bytes(const char* p) {
  return reinterpret_cast<const unsigned char*>(p);
}
unsigned char* Bytes(char* p) { return reinterpret_cast<unsigned char*>(p); }

}  // namespace

// An AES-256-GCM context keyed once per stream.
class FrameCipher {
 public:
  FrameCipher(const std::string& key, bool encrypt)
      : ctx_(EVP_CIPHER_CTX_new()), encrypt_(encrypt) {
    ok_ = ctx_ != nullptr &&
          EVP_CipherInit_ex(ctx_, EVP_aes_256_gcm(), nullptr, Bytes(key.data()),
                            nullptr, encrypt ? 1 : 0) == 1;
  }
  ~FrameCipher() { EVP_CIPHER_CTX_free(ctx_); }
  FrameCipher(const FrameCipher&) = delete;
  FrameCipher& operator=(const FrameCipher&) = delete;

  // Encrypts or decrypts frame[kHeaderBytes, size - kTagBytes) in place
  // under the nonce of `seq`, authenticating the header too; the tag is
  // the frame's last kTagBytes (written when encrypting, checked when
  // decrypting). False when decryption finds the tag wrong (or OpenSSL
  // fails).
  bool Apply(uint64_t seq, std::string& frame) {
    if (!ok_ || frame.size() - kHeaderBytes - kTagBytes > INT_MAX) {
      return false;
    }
    unsigned char nonce[kNonceBytes];
    Nonce(seq, nonce);
    const int body = static_cast<int>(frame.size() - kHeaderBytes - kTagBytes);
    unsigned char* text = Bytes(frame.data() + kHeaderBytes);
    unsigned char* tag = Bytes(frame.data() + kHeaderBytes + body);
    int n = 0;
    if (EVP_CipherInit_ex(ctx_, nullptr, nullptr, nullptr, nonce, -1) != 1 ||
        EVP_CipherUpdate(ctx_, nullptr, &n, Bytes(frame.data()),
                         static_cast<int>(kHeaderBytes)) != 1 ||
        (body > 0 && EVP_CipherUpdate(ctx_, text, &n, text, body) != 1)) {
      return false;
    }
    if (!encrypt_ &&
        EVP_CIPHER_CTX_ctrl(ctx_, EVP_CTRL_GCM_SET_TAG,
                            static_cast<int>(kTagBytes), tag) != 1) {
      return false;
    }
    if (EVP_CipherFinal_ex(ctx_, text + body, &n) != 1) return false;
    return !encrypt_ ||
           EVP_CIPHER_CTX_ctrl(ctx_, EVP_CTRL_GCM_GET_TAG,
                               static_cast<int>(kTagBytes), tag) == 1;
  }

 private:
  EVP_CIPHER_CTX* const ctx_;
  const bool encrypt_;
  bool ok_ = false;
};

TransferSecret TransferSecret::New() {
  return TransferSecret{RandomBytes(kSecretBytes), RandomBytes(kSecretBytes)};
}

SecureSender::SecureSender(std::unique_ptr<ChunkSender> inner,
                           TransferSecret secret)
    : inner_(std::move(inner)),
      secret_(std::move(secret)),
      cipher_(std::make_unique<FrameCipher>(secret_.key, /*encrypt=*/true)) {}

SecureSender::~SecureSender() = default;

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
  frame_.resize(kHeaderBytes + payload.size() + kTagBytes);
  frame_[0] = kind;
  absl::little_endian::Store64(&frame_[1], seq_);
  if (!payload.empty()) {
    std::memcpy(&frame_[kHeaderBytes], payload.data(), payload.size());
  }
  if (!cipher_->Apply(seq_, frame_)) {
    return absl::InternalError(
        absl::StrCat("AES-256-GCM could not encrypt transfer frame ", seq_));
  }
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
  if (failed_.ok()) {
    cipher_ = std::make_unique<FrameCipher>(secret_.key, /*encrypt=*/false);
  }
}

SecureReceiver::~SecureReceiver() = default;

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
    if (frame.size() < kHeaderBytes + kTagBytes) {
      return absl::DataLossError(absl::StrCat(
          "a transfer frame of ", frame.size(), " bytes is shorter than ",
          kHeaderBytes + kTagBytes, " (truncated)"));
    }
    const char kind = frame[0];
    const uint64_t seq = absl::little_endian::Load64(&frame[1]);
    // The header is authenticated with the payload: a changed sequence
    // number fails here too.
    if (!cipher_->Apply(seq, frame)) {
      return absl::PermissionDeniedError(absl::StrCat(
          "frame ", seq_,
          " of the transfer failed its AES-256-GCM check (damaged, or not "
          "sent by the peer this transfer was authorised for); transfer "
          "aborted"));
    }
    if (seq != seq_) {
      return absl::DataLossError(
          absl::StrCat("transfer frame ", seq, " arrived where frame ", seq_,
                       " was due (a frame was lost or repeated)"));
    }
    const size_t payload_size = frame.size() - kHeaderBytes - kTagBytes;
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
