// The cross-shard sum of tensor parallelism for processes (DESIGN.md section
// 7): every rank contributes its partials, every rank gets the sum of all of
// them added in one fixed order, rank 0's partials first and each rank's in
// its own order: ((p_0,0 + p_0,1) + p_1,0) + ... Nothing depends on an
// algorithm or a message size: each rank receives every other rank's
// partials whole (an all-gather over the chunk-stream transport) and adds
// them itself, so every rank computes the same bits (what ops'
// ShardReducer requires of it).
//
//   auto ar = OrderedAllReduce::Create(&ucx, rank, size);
//   ... give ar->InboxFor(p) to rank p; collect each peer's inbox for us ...
//   KVD_RETURN_IF_ERROR(ar->Connect(peer_inboxes));
//   KVD_RETURN_IF_ERROR(ar->Reduce(parts, n, out, deadline));
//
// A peer that dies or stalls fails Reduce with UNAVAILABLE or
// DEADLINE_EXCEEDED, and every later Reduce with the same error.
//
// Thread-safety: one thread calls Reduce at a time; the sends run on one
// thread per peer, owned here.
#ifndef KVD_SERVICES_COLLECTIVE_ORDERED_ALL_REDUCE_H_
#define KVD_SERVICES_COLLECTIVE_ORDERED_ALL_REDUCE_H_

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "services/transport/chunk_stream.h"

namespace kvd::collective {

class OrderedAllReduce {
 public:
  // Opens one inbox per peer. INVALID_ARGUMENT unless 0 <= rank < size.
  static absl::StatusOr<std::unique_ptr<OrderedAllReduce>> Create(
      transport::Transport* transport, int rank, int size,
      int64_t max_bytes = int64_t{256} << 20);
  ~OrderedAllReduce();

  int rank() const { return rank_; }
  int size() const { return size_; }
  // The address rank `peer` sends to ("" for this rank itself).
  std::string InboxFor(int peer) const;
  // `inboxes[p]`: the address rank p opened for this rank (ignored for
  // this rank). UNAVAILABLE if a peer cannot be reached.
  absl::Status Connect(const std::vector<std::string>& inboxes);

  // `parts`: this rank's partials, n floats each, the same count on every
  // rank. Writes the ordered sum of every rank's partials to out[0, n).
  absl::Status Reduce(absl::Span<const float* const> parts, int64_t n,
                      float* out, absl::Time deadline);

 private:
  OrderedAllReduce(int rank, int size) : rank_(rank), size_(size) {}
  // One peer's outgoing stream, fed by Reduce and sent by its thread, so
  // that every rank can send and receive at once (a blocking send to a rank
  // that is itself sending would deadlock).
  struct Outbox {
    std::unique_ptr<transport::ChunkSender> sender;
    std::mutex mu;
    std::condition_variable cv;
    std::shared_ptr<const std::string> pending;  // null: nothing to send
    bool stop = false;
    absl::Status last;
    int64_t sent = 0;  // messages sent so far
    std::thread thread;
  };
  void SendLoop(Outbox* box);

  const int rank_, size_;
  transport::Transport* transport_ = nullptr;
  std::vector<std::unique_ptr<transport::ChunkReceiver>> inboxes_;
  std::vector<std::unique_ptr<Outbox>> outboxes_;
  int64_t reduces_ = 0;
  absl::Status failed_;
  std::vector<std::string> received_;
};

}  // namespace kvd::collective

#endif  // KVD_SERVICES_COLLECTIVE_ORDERED_ALL_REDUCE_H_
