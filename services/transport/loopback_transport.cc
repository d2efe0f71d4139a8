#include "services/transport/loopback_transport.h"

#include <deque>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kvd::transport {

struct LoopbackTransport::Queue {
  absl::Mutex mu;
  std::deque<std::string> chunks ABSL_GUARDED_BY(mu);
  bool connected ABSL_GUARDED_BY(mu) = false;
  bool closed ABSL_GUARDED_BY(mu) = false;  // the sender's Close
  bool broken ABSL_GUARDED_BY(mu) = false;  // sender gone without Close
  bool receiver_gone ABSL_GUARDED_BY(mu) = false;
  bool cancelled ABSL_GUARDED_BY(mu) = false;
  int64_t max_chunk_bytes = 0;
  int capacity = 0;
};

namespace {

class LoopbackSender : public ChunkSender {
 public:
  explicit LoopbackSender(std::shared_ptr<LoopbackTransport::Queue> q)
      : q_(std::move(q)) {}
  ~LoopbackSender() override {
    absl::MutexLock lock(&q_->mu);
    if (!q_->closed) q_->broken = true;
  }

  absl::Status Send(absl::string_view chunk) override {
    absl::MutexLock lock(&q_->mu);
    auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(q_->mu) {
      return q_->receiver_gone || q_->cancelled ||
             static_cast<int>(q_->chunks.size()) < q_->capacity;
    };
    if (!q_->mu.AwaitWithTimeout(absl::Condition(&room), absl::Seconds(30))) {
      return absl::DeadlineExceededError(
          "loopback receiver took nothing for 30 s");
    }
    if (q_->receiver_gone || q_->cancelled) {
      return absl::UnavailableError("loopback receiver is gone");
    }
    if (q_->closed) {
      return absl::FailedPreconditionError("Send after Close");
    }
    q_->chunks.emplace_back(chunk);
    return absl::OkStatus();
  }

  absl::Status Close() override {
    absl::MutexLock lock(&q_->mu);
    if (q_->receiver_gone) {
      return absl::UnavailableError("loopback receiver is gone");
    }
    q_->closed = true;
    return absl::OkStatus();
  }

 private:
  std::shared_ptr<LoopbackTransport::Queue> q_;
};

class LoopbackReceiver : public ChunkReceiver {
 public:
  LoopbackReceiver(std::string address,
                   std::shared_ptr<LoopbackTransport::Queue> q)
      : address_(std::move(address)), q_(std::move(q)) {}
  ~LoopbackReceiver() override {
    absl::MutexLock lock(&q_->mu);
    q_->receiver_gone = true;
  }

  const std::string& address() const override { return address_; }

  absl::StatusOr<bool> Receive(std::string* chunk,
                               absl::Time deadline) override {
    absl::MutexLock lock(&q_->mu);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(q_->mu) {
      return !q_->chunks.empty() || q_->closed || q_->broken || q_->cancelled;
    };
    if (!q_->mu.AwaitWithDeadline(absl::Condition(&ready), deadline)) {
      return absl::DeadlineExceededError(
          "no chunk arrived on the loopback stream in time");
    }
    if (q_->cancelled) return absl::CancelledError("transfer cancelled");
    if (!q_->chunks.empty()) {
      if (static_cast<int64_t>(q_->chunks.front().size()) >
          q_->max_chunk_bytes) {
        q_->cancelled = true;
        return absl::ResourceExhaustedError(absl::StrCat(
            "a chunk of ", q_->chunks.front().size(),
            " bytes exceeds this stream's limit of ", q_->max_chunk_bytes));
      }
      *chunk = std::move(q_->chunks.front());
      q_->chunks.pop_front();
      return true;
    }
    if (q_->broken) {
      return absl::UnavailableError(
          "the sender went away before closing the stream");
    }
    return false;  // closed and drained
  }

  void Cancel() override {
    absl::MutexLock lock(&q_->mu);
    q_->cancelled = true;
  }

 private:
  const std::string address_;
  std::shared_ptr<LoopbackTransport::Queue> q_;
};

}  // namespace

LoopbackTransport::LoopbackTransport(int queue_chunks)
    : queue_chunks_(queue_chunks < 1 ? 1 : queue_chunks) {}

LoopbackTransport::~LoopbackTransport() = default;

absl::StatusOr<std::unique_ptr<ChunkReceiver>> LoopbackTransport::Listen(
    const ListenOptions& options) {
  auto q = std::make_shared<Queue>();
  q->max_chunk_bytes = options.max_chunk_bytes;
  q->capacity = queue_chunks_;
  absl::MutexLock lock(&mu_);
  std::string address = absl::StrCat("loopback:", next_id_++);
  queues_[address] = q;
  return std::make_unique<LoopbackReceiver>(address, std::move(q));
}

absl::StatusOr<std::unique_ptr<ChunkSender>> LoopbackTransport::Connect(
    absl::string_view address) {
  absl::MutexLock lock(&mu_);
  auto it = queues_.find(std::string(address));
  std::shared_ptr<Queue> q = it == queues_.end() ? nullptr : it->second.lock();
  if (q == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("no loopback receiver at '", address, "'"));
  }
  queues_.erase(it);  // one sender per receiver
  {
    absl::MutexLock qlock(&q->mu);
    q->connected = true;
  }
  return std::make_unique<LoopbackSender>(std::move(q));
}

}  // namespace kvd::transport
