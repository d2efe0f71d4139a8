// Throughput of a secured transfer: 64 MiB in 1 MiB pieces (a migration's
// piece size, PeerOptions::piece_bytes) from a SecureSender to a
// SecureReceiver, over the in-process loopback (the framing's own cost:
// sealing and opening every frame) and over UCX on TCP and shared memory
// (what a migration between nodes pays), beside the same bytes sent with no
// framing at all. Payload bytes per second; no timing is asserted anywhere.
//
//   bazel run -c opt //services/transport:secure_stream_benchmark
#include <memory>
#include <string>
#include <thread>

#include "absl/time/clock.h"
#include "benchmark/benchmark.h"
#include "services/transport/loopback_transport.h"
#include "services/transport/secure_stream.h"
#include "services/transport/ucx_transport.h"

namespace kvd::transport {
namespace {

constexpr size_t kPiece = size_t{1} << 20;
constexpr int kPieces = 64;

std::unique_ptr<Transport> Make(int kind) {
  if (kind == 0) return std::make_unique<LoopbackTransport>();
  auto ucx = UcxTransport::Create({.tls = kind == 1 ? "tcp" : "sm"});
  if (!ucx.ok()) return nullptr;
  return *std::move(ucx);
}

// One transfer of kPieces pieces per iteration, framed by SecureSender /
// SecureReceiver when `secure`, else sent as they are.
void Transfer(benchmark::State& state, bool secure) {
  std::unique_ptr<Transport> plane = Make(static_cast<int>(state.range(0)));
  if (plane == nullptr) {
    state.SkipWithError("UCX transport unavailable");
    return;
  }
  state.SetLabel(state.range(0) == 0   ? "loopback"
                 : state.range(0) == 1 ? "ucx tcp"
                                       : "ucx sm");
  std::string piece(kPiece, '\0');
  for (size_t i = 0; i < piece.size(); ++i) piece[i] = static_cast<char>(i);
  for (auto _ : state) {
    const TransferSecret secret = TransferSecret::New();
    auto inbox = plane->Listen({.max_chunk_bytes = 2 * kPiece});
    if (!inbox.ok()) {
      state.SkipWithError("listen failed");
      return;
    }
    const std::string address = (*inbox)->address();
    std::unique_ptr<SecureReceiver> in;
    if (secure)
      in = std::make_unique<SecureReceiver>(std::move(*inbox), secret);
    absl::Status sent;
    std::thread sender([&] {
      auto out = plane->Connect(address);
      if (!out.ok()) {
        sent = out.status();
        return;
      }
      if (!secure) {
        for (int i = 0; i < kPieces && sent.ok(); ++i)
          sent = (*out)->Send(piece);
        if (sent.ok()) sent = (*out)->Close();
        return;
      }
      auto framed = SecureSender::Start(std::move(*out), secret);
      if (!framed.ok()) {
        sent = framed.status();
        return;
      }
      for (int i = 0; i < kPieces && sent.ok(); ++i) {
        sent = (*framed)->Send(piece);
      }
      if (sent.ok()) sent = (*framed)->Finish();
    });
    std::string got;
    int received = 0;
    for (;;) {
      const absl::Time deadline = absl::Now() + absl::Seconds(30);
      absl::StatusOr<bool> more = secure ? in->Receive(&got, deadline)
                                         : (*inbox)->Receive(&got, deadline);
      if (!more.ok() || !*more) break;
      received++;
    }
    sender.join();
    if (!sent.ok() || received != kPieces) {
      state.SkipWithError("transfer failed");
      return;
    }
  }
  state.SetBytesProcessed(state.iterations() * kPieces *
                          static_cast<int64_t>(kPiece));
}

void BM_SecureTransfer(benchmark::State& state) { Transfer(state, true); }
BENCHMARK(BM_SecureTransfer)
    ->Arg(0)
    ->Arg(1)
    ->Arg(2)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// The same bytes with no framing at all: what the data plane alone moves.
// Not over UCX on TCP: a plain stream of 1 MiB messages back to back takes
// 0.2-0.5 s per message there (a secured one does not); see
// docs/BENCHMARKS.md.
void BM_PlainTransfer(benchmark::State& state) { Transfer(state, false); }
BENCHMARK(BM_PlainTransfer)
    ->Arg(0)
    ->Arg(2)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace kvd::transport
