#include "services/collective/ordered_all_reduce.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kvd::collective {

absl::StatusOr<std::unique_ptr<OrderedAllReduce>> OrderedAllReduce::Create(
    transport::Transport* transport, int rank, int size, int64_t max_bytes) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " of ", size, ": want 0 <= rank < size"));
  }
  std::unique_ptr<OrderedAllReduce> ar(new OrderedAllReduce(rank, size));
  ar->transport_ = transport;
  ar->inboxes_.resize(size);
  ar->received_.resize(size);
  for (int p = 0; p < size; ++p) {
    if (p == rank) continue;
    transport::ListenOptions o;
    o.max_chunk_bytes = max_bytes;
    absl::StatusOr<std::unique_ptr<transport::ChunkReceiver>> in =
        transport->Listen(o);
    if (!in.ok()) return in.status();
    ar->inboxes_[p] = *std::move(in);
  }
  return ar;
}

OrderedAllReduce::~OrderedAllReduce() {
  for (auto& box : outboxes_) {
    if (box == nullptr) continue;
    {
      std::lock_guard<std::mutex> l(box->mu);
      box->stop = true;
    }
    box->cv.notify_all();
    if (box->thread.joinable()) box->thread.join();
    // No Close: at the end of a collective its peers may be gone already,
    // and a clean end of stream would wait out the send timeout for them.
    box->sender.reset();
  }
}

std::string OrderedAllReduce::InboxFor(int peer) const {
  if (peer < 0 || peer >= size_ || inboxes_[peer] == nullptr) return "";
  return inboxes_[peer]->address();
}

absl::Status OrderedAllReduce::Connect(
    const std::vector<std::string>& inboxes) {
  if (static_cast<int>(inboxes.size()) != size_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "want one inbox address per rank (", size_, "), got ", inboxes.size()));
  }
  outboxes_.resize(size_);
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    absl::StatusOr<std::unique_ptr<transport::ChunkSender>> out =
        transport_->Connect(inboxes[p]);
    if (!out.ok()) {
      return absl::UnavailableError(absl::StrCat("rank ", rank_,
                                                 " cannot reach rank ", p, ": ",
                                                 out.status().message()));
    }
    auto box = std::make_unique<Outbox>();
    box->sender = *std::move(out);
    Outbox* raw = box.get();
    box->thread = std::thread([this, raw] { SendLoop(raw); });
    outboxes_[p] = std::move(box);
  }
  return absl::OkStatus();
}

void OrderedAllReduce::SendLoop(Outbox* box) {
  std::unique_lock<std::mutex> l(box->mu);
  for (;;) {
    box->cv.wait(l, [box] { return box->pending != nullptr || box->stop; });
    if (box->stop) return;
    std::shared_ptr<const std::string> msg = std::move(box->pending);
    box->pending = nullptr;
    l.unlock();
    absl::Status s = box->sender->Send(*msg);
    l.lock();
    box->last = s;
    ++box->sent;
    box->cv.notify_all();
  }
}

absl::Status OrderedAllReduce::Reduce(absl::Span<const float* const> parts,
                                      int64_t n, float* out,
                                      absl::Time deadline) {
  if (!failed_.ok()) return failed_;
  if (static_cast<int>(outboxes_.size()) != size_) {
    return absl::FailedPreconditionError("Reduce before Connect");
  }
  if (parts.empty() || n <= 0) {
    return absl::InvalidArgumentError("Reduce needs partials of n > 0 floats");
  }
  const int64_t bytes = n * static_cast<int64_t>(sizeof(float));
  const size_t message_bytes = bytes * parts.size();
  auto mine = std::make_shared<std::string>(message_bytes, '\0');
  for (size_t i = 0; i < parts.size(); ++i) {
    std::memcpy(mine->data() + i * bytes, parts[i], bytes);
  }
  // Hand this rank's partials (one buffer, shared) to every peer's sender.
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    Outbox* box = outboxes_[p].get();
    std::lock_guard<std::mutex> l(box->mu);
    box->pending = mine;
    box->cv.notify_all();
  }
  absl::Status status;
  for (int p = 0; p < size_ && status.ok(); ++p) {
    if (p == rank_) continue;
    absl::StatusOr<bool> more = inboxes_[p]->Receive(&received_[p], deadline);
    if (!more.ok()) {
      status =
          absl::Status(more.status().code(),
                       absl::StrCat("rank ", rank_, " receiving from rank ", p,
                                    ": ", more.status().message()));
    } else if (!*more || received_[p].size() != message_bytes) {
      status = absl::UnavailableError(
          absl::StrCat("rank ", p, " sent ", *more ? received_[p].size() : 0,
                       " bytes of partials, want ", message_bytes,
                       *more ? "" : " (its stream ended)"));
    }
  }
  // Wait for this reduce's sends, so that the next one cannot overtake.
  ++reduces_;
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    Outbox* box = outboxes_[p].get();
    std::unique_lock<std::mutex> l(box->mu);
    box->cv.wait(l, [&] { return box->sent >= reduces_; });
    if (status.ok() && !box->last.ok()) {
      status = absl::UnavailableError(absl::StrCat(
          "rank ", rank_, " sending to rank ", p, ": ", box->last.message()));
    }
  }
  if (!status.ok()) {
    failed_ = status;
    return status;
  }
  // The ordered sum: rank by rank, each rank's partials in order. A peer's
  // bytes are copied out as floats first (a string's bytes are not floats).
  std::vector<float> part(n);
  for (int p = 0; p < size_; ++p) {
    for (size_t i = 0; i < parts.size(); ++i) {
      const float* src = parts[i];
      if (p != rank_) {
        std::memcpy(part.data(), received_[p].data() + i * bytes, bytes);
        src = part.data();
      }
      if (p == 0 && i == 0) {
        std::memcpy(out, src, bytes);
      } else {
        for (int64_t j = 0; j < n; ++j) out[j] += src[j];
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace kvd::collective
