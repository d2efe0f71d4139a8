// A Transport decorator for tests (the name says so: not a transport to
// deploy): senders it connects damage their stream as told, below any
// framing, so tests can check that every fault aborts a transfer cleanly.
//
//   FaultInjectingTransport faulty(&ucx, {.kind = Fault::kFlipByte,
//                                          .at_chunk = 3});
//   ... migrate through `faulty`: the target must refuse the transfer ...
//
// Thread-safety: as the transport it wraps.
#ifndef KVD_SERVICES_TRANSPORT_FAULT_INJECTING_TRANSPORT_H_
#define KVD_SERVICES_TRANSPORT_FAULT_INJECTING_TRANSPORT_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "services/transport/chunk_stream.h"

namespace kvd::transport {

enum class Fault {
  kNone,
  kDelay,       // every chunk waits `delay` before it is sent
  kDrop,        // chunk `at_chunk` is not sent
  kTruncate,    // chunk `at_chunk` loses its second half
  kFlipByte,    // one byte in the middle of chunk `at_chunk` is inverted
  kDisconnect,  // the stream breaks (no Close) instead of sending `at_chunk`
  kDuplicate,   // chunk `at_chunk` is sent twice
};

struct FaultSpec {
  Fault kind = Fault::kNone;
  int64_t at_chunk = 0;  // 0 = the first chunk
  absl::Duration delay = absl::ZeroDuration();
};

// "flip-byte@3", for test names and logs.
std::string FaultName(const FaultSpec& spec);

class FaultInjectingTransport : public Transport {
 public:
  // `inner` outlives this.
  FaultInjectingTransport(Transport* inner, FaultSpec spec)
      : inner_(inner), spec_(spec) {}

  std::string name() const override;
  absl::StatusOr<std::unique_ptr<ChunkReceiver>> Listen(
      const ListenOptions& options) override {
    return inner_->Listen(options);
  }
  absl::StatusOr<std::unique_ptr<ChunkSender>> Connect(
      absl::string_view address) override;

 private:
  Transport* const inner_;
  const FaultSpec spec_;
};

}  // namespace kvd::transport

#endif  // KVD_SERVICES_TRANSPORT_FAULT_INJECTING_TRANSPORT_H_
