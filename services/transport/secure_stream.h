// Authorises, authenticates and encrypts a chunk stream (chunk_stream.h).
// UCX has no encryption or authentication, so every transfer is authorised
// over the control channel (gRPC over TLS, which already authenticates the
// peer node): the receiver makes a TransferSecret (a one-time token and a
// fresh AES-256 key), hands it to the sender there, and accepts only a
// stream that proves it holds it. A capture of the wire shows no payload
// byte (no token id, no residual) in the clear.
//
// Each chunk travels as a frame:
//   u8 kind, u64 sequence number (from 0)        (in the clear, authenticated)
//   AES-256-GCM(key, nonce = sequence number, payload)
//   the GCM tag over both                          (16 bytes)
// kinds: 'H' (first frame; its payload is the one-time token), 'D' (data),
// 'E' (last frame; its payload is the u64 count of data frames). A frame
// whose tag, token, sequence or kind is wrong, a stream that ends before its
// 'E' frame, or anything after it aborts the transfer: PERMISSION_DENIED for
// a failed proof (tag, token), DATA_LOSS for a damaged or cut stream. A key
// is drawn per transfer and a stream never repeats a sequence number, so no
// nonce is ever used twice under one key. The payloads' own checksums
// (checkpoint chunks carry CRC32C) travel inside, so they are checked end to
// end again by whoever decodes them.
//
//   TransferSecret secret = TransferSecret::New();       // receiver
//   SecureReceiver in(std::move(receiver), secret);
//   ... secret to the sender over gRPC ...
//   KVD_ASSIGN_OR_RETURN(auto out, SecureSender::Start(std::move(s), secret));
//   KVD_RETURN_IF_ERROR(out->Send(piece));
//   KVD_RETURN_IF_ERROR(out->Finish());
//   // receiver: while (in.Receive(&piece, deadline) is true) ...
//
// A secret is good for one stream: a receiver accepts one 'H' frame.
//
// Thread-safety: one thread per sender or receiver (Cancel: any thread).
#ifndef KVD_SERVICES_TRANSPORT_SECURE_STREAM_H_
#define KVD_SERVICES_TRANSPORT_SECURE_STREAM_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "services/transport/chunk_stream.h"

namespace kvd::transport {

inline constexpr size_t kSecretBytes = 32;
inline constexpr size_t kFrameOverheadBytes = 1 + 8 + 16;

class FrameCipher;  // AES-256-GCM under one transfer's key (the .cc's)

struct TransferSecret {
  std::string token;  // kSecretBytes random bytes
  std::string key;    // kSecretBytes random bytes: the AES-256 key
  // From the OS's CSPRNG (OpenSSL RAND_bytes); aborts if it has none.
  static TransferSecret New();
};

class SecureSender {
 public:
  // Sends the 'H' frame. INVALID_ARGUMENT for a malformed secret.
  static absl::StatusOr<std::unique_ptr<SecureSender>> Start(
      std::unique_ptr<ChunkSender> inner, const TransferSecret& secret);

  absl::Status Send(absl::string_view payload);
  // Sends the 'E' frame and closes the stream.
  absl::Status Finish();

  int64_t payload_bytes() const { return payload_bytes_; }
  int64_t wire_bytes() const { return wire_bytes_; }
  ~SecureSender();

 private:
  SecureSender(std::unique_ptr<ChunkSender> inner, TransferSecret secret);
  absl::Status SendFrame(char kind, absl::string_view payload);

  std::unique_ptr<ChunkSender> inner_;
  const TransferSecret secret_;
  std::unique_ptr<FrameCipher> cipher_;
  uint64_t seq_ = 0;
  uint64_t data_frames_ = 0;
  int64_t payload_bytes_ = 0;
  int64_t wire_bytes_ = 0;
  std::string frame_;
};

class SecureReceiver {
 public:
  SecureReceiver(std::unique_ptr<ChunkReceiver> inner, TransferSecret secret);
  ~SecureReceiver();

  // Where the sender connects (the inner receiver's address).
  const std::string& address() const { return inner_->address(); }
  // The next data payload into *payload; false after a verified 'E' frame.
  // Errors as above, plus the inner receiver's (deadline, cancellation).
  // Once it has failed, it keeps returning that error.
  absl::StatusOr<bool> Receive(std::string* payload, absl::Time deadline);
  // Makes a Receive in progress (another thread) end with CANCELLED.
  void Cancel() { inner_->Cancel(); }

  int64_t payload_bytes() const { return payload_bytes_; }

 private:
  absl::StatusOr<bool> ReceiveFrame(std::string* payload, absl::Time deadline);

  std::unique_ptr<ChunkReceiver> inner_;
  const TransferSecret secret_;
  std::unique_ptr<FrameCipher> cipher_;  // null for a malformed secret
  uint64_t seq_ = 0;
  uint64_t data_frames_ = 0;
  int64_t payload_bytes_ = 0;
  bool ended_ = false;
  absl::Status failed_;
};

}  // namespace kvd::transport

#endif  // KVD_SERVICES_TRANSPORT_SECURE_STREAM_H_
