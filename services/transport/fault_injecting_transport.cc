#include "services/transport/fault_injecting_transport.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace kvd::transport {
namespace {

class FaultInjectingSender : public ChunkSender {
 public:
  FaultInjectingSender(std::unique_ptr<ChunkSender> inner, FaultSpec spec)
      : inner_(std::move(inner)), spec_(spec) {}

  absl::Status Send(absl::string_view chunk) override {
    if (inner_ == nullptr) {
      return absl::UnavailableError("the stream was broken (injected fault)");
    }
    const bool here = sent_++ == spec_.at_chunk;
    switch (spec_.kind) {
      case Fault::kNone:
        break;
      case Fault::kDelay:
        absl::SleepFor(spec_.delay);
        break;
      case Fault::kDrop:
        if (here) return absl::OkStatus();
        break;
      case Fault::kTruncate:
        if (here) return inner_->Send(chunk.substr(0, chunk.size() / 2));
        break;
      case Fault::kFlipByte:
        if (here && !chunk.empty()) {
          std::string damaged(chunk);
          damaged[damaged.size() / 2] ^= 0xff;
          return inner_->Send(damaged);
        }
        break;
      case Fault::kDisconnect:
        if (here) {
          inner_.reset();  // gone without Close: the stream breaks
          return absl::UnavailableError(
              "the stream was broken (injected fault)");
        }
        break;
      case Fault::kDuplicate:
        if (here) {
          absl::Status first = inner_->Send(chunk);
          if (!first.ok()) return first;
        }
        break;
    }
    return inner_->Send(chunk);
  }

  absl::Status Close() override {
    if (inner_ == nullptr) {
      return absl::UnavailableError("the stream was broken (injected fault)");
    }
    return inner_->Close();
  }

 private:
  std::unique_ptr<ChunkSender> inner_;
  const FaultSpec spec_;
  int64_t sent_ = 0;
};

}  // namespace

std::string FaultName(const FaultSpec& spec) {
  switch (spec.kind) {
    case Fault::kNone:
      return "none";
    case Fault::kDelay:
      return absl::StrCat("delay-", absl::FormatDuration(spec.delay));
    case Fault::kDrop:
      return absl::StrCat("drop@", spec.at_chunk);
    case Fault::kTruncate:
      return absl::StrCat("truncate@", spec.at_chunk);
    case Fault::kFlipByte:
      return absl::StrCat("flip-byte@", spec.at_chunk);
    case Fault::kDisconnect:
      return absl::StrCat("disconnect@", spec.at_chunk);
    case Fault::kDuplicate:
      return absl::StrCat("duplicate@", spec.at_chunk);
  }
  return "unknown";
}

std::string FaultInjectingTransport::name() const {
  return absl::StrCat(inner_->name(), "+fault(", FaultName(spec_), ")");
}

absl::StatusOr<std::unique_ptr<ChunkSender>> FaultInjectingTransport::Connect(
    absl::string_view address) {
  absl::StatusOr<std::unique_ptr<ChunkSender>> inner = inner_->Connect(address);
  if (!inner.ok()) return inner.status();
  return std::unique_ptr<ChunkSender>(
      new FaultInjectingSender(std::move(*inner), spec_));
}

}  // namespace kvd::transport
