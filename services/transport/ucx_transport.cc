#include "services/transport/ucx_transport.h"

#include <poll.h>
#include <ucp/api/ucp.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace kvd::transport {
namespace {

// A chunk, and the empty message that ends a stream.
constexpr ucp_tag_t kTagData = 1;
constexpr ucp_tag_t kTagEnd = 2;

absl::Status UcxError(absl::string_view what, ucs_status_t s) {
  return absl::UnavailableError(
      absl::StrCat("UCX ", what, " failed: ", ucs_status_string(s)));
}

enum class Wait { kDone, kDeadline, kCancelled };

}  // namespace

struct UcxTransport::Context {
  ucp_context_h h = nullptr;
  ~Context() {
    if (h != nullptr) ucp_cleanup(h);
  }
};

namespace {

// One UCP worker and its wake-up fd; destroyed after its endpoints.
class Worker {
 public:
  static absl::StatusOr<std::unique_ptr<Worker>> Create(
      std::shared_ptr<UcxTransport::Context> context) {
    ucp_worker_params_t params{};
    params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    params.thread_mode = UCS_THREAD_MODE_SINGLE;
    ucp_worker_h h = nullptr;
    ucs_status_t s = ucp_worker_create(context->h, &params, &h);
    if (s != UCS_OK) return UcxError("worker create", s);
    auto w = std::unique_ptr<Worker>(new Worker(std::move(context), h));
    s = ucp_worker_get_efd(h, &w->efd_);
    if (s != UCS_OK) return UcxError("worker event fd", s);
    return w;
  }
  ~Worker() {
    // Lets wire-up messages in flight (a peer's endpoint still connecting)
    // finish first: UCX 1.13 asserts when it purges a pending reply while
    // destroying a worker.
    ucp_request_param_t param{};
    Complete(ucp_worker_flush_nbx(h_, &param), "worker flush",
             absl::Now() + absl::Seconds(1))
        .IgnoreError();
    ucp_worker_destroy(h_);
  }

  ucp_worker_h h() const { return h_; }

  // Progresses the worker until `done()`, sleeping on its event fd between
  // events.
  Wait ProgressUntil(const std::function<bool()>& done, absl::Time deadline,
                     const std::atomic<bool>* cancelled = nullptr) {
    for (;;) {
      while (ucp_worker_progress(h_) != 0) {
      }
      if (done()) return Wait::kDone;
      if (cancelled != nullptr && cancelled->load()) return Wait::kCancelled;
      const absl::Time now = absl::Now();
      if (now >= deadline) return Wait::kDeadline;
      if (ucp_worker_arm(h_) == UCS_ERR_BUSY) continue;  // events pending
      // Woken by the fd; the cap re-checks cancellation and the deadline.
      const int ms = static_cast<int>(std::clamp<int64_t>(
          absl::ToInt64Milliseconds(deadline - now) + 1, 1, 50));
      pollfd p{efd_, POLLIN, 0};
      poll(&p, 1, ms);
    }
  }

  // Waits for a request from a *_nbx call; frees it. `cancelled` / deadline
  // cancel the request.
  absl::Status Complete(ucs_status_ptr_t req, absl::string_view what,
                        absl::Time deadline,
                        const std::atomic<bool>* cancelled = nullptr,
                        const ucs_status_t* ep_failed = nullptr) {
    if (req == nullptr) return absl::OkStatus();
    if (UCS_PTR_IS_ERR(req)) return UcxError(what, UCS_PTR_STATUS(req));
    auto finished = [&] {
      return ucp_request_check_status(req) != UCS_INPROGRESS ||
             (ep_failed != nullptr && *ep_failed != UCS_OK);
    };
    Wait w = ProgressUntil(finished, deadline, cancelled);
    absl::Status status;
    if (ucp_request_check_status(req) == UCS_INPROGRESS) {
      // Not every request can be cancelled (a send in flight); one still in
      // progress is released by UCX when its endpoint closes (freed below).
      ucp_request_cancel(h_, req);
      ProgressUntil(
          [&] { return ucp_request_check_status(req) != UCS_INPROGRESS; },
          absl::Now() + absl::Milliseconds(200));
      if (w == Wait::kCancelled) {
        status = absl::CancelledError(absl::StrCat(what, " cancelled"));
      } else if (ep_failed != nullptr && *ep_failed != UCS_OK) {
        status = UcxError(what, *ep_failed);
      } else {
        status = absl::DeadlineExceededError(
            absl::StrCat(what, " did not complete in time"));
      }
    } else {
      const ucs_status_t s = ucp_request_check_status(req);
      if (s != UCS_OK) status = UcxError(what, s);
    }
    ucp_request_free(req);
    return status;
  }

 private:
  Worker(std::shared_ptr<UcxTransport::Context> context, ucp_worker_h h)
      : context_(std::move(context)), h_(h) {}
  std::shared_ptr<UcxTransport::Context> context_;  // outlives the worker
  ucp_worker_h h_;
  int efd_ = -1;
};

class UcxSender : public ChunkSender {
 public:
  static absl::StatusOr<std::unique_ptr<UcxSender>> Connect(
      std::shared_ptr<UcxTransport::Context> context, absl::string_view address,
      const UcxOptions& options) {
    absl::StatusOr<std::unique_ptr<Worker>> worker =
        Worker::Create(std::move(context));
    if (!worker.ok()) return worker.status();
    auto sender = std::unique_ptr<UcxSender>(
        new UcxSender(std::move(*worker), options.send_timeout));
    // The address bytes outlive ucp_ep_create, which copies what it needs.
    const std::string addr(address);
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                        UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                        UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.address = reinterpret_cast<const ucp_address_t*>(addr.data());
    // Peer failures are reported only by connection-based transports
    // (tcp); shared memory refuses an endpoint that asks for it.
    const bool tcp_allowed = options.tls.empty() ||
                             absl::StrContains(options.tls, "tcp") ||
                             absl::StrContains(options.tls, "all");
    params.err_mode =
        tcp_allowed ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
    params.err_handler.cb = &UcxSender::OnEndpointError;
    params.err_handler.arg = sender.get();
    ucs_status_t s = ucp_ep_create(sender->worker_->h(), &params, &sender->ep_);
    if (s == UCS_ERR_UNREACHABLE) {
      // Shared-memory transports cannot report a failed peer; there a
      // vanished receiver shows as the send timeout instead.
      params.err_mode = UCP_ERR_HANDLING_MODE_NONE;
      params.field_mask &= ~UCP_EP_PARAM_FIELD_ERR_HANDLER;
      s = ucp_ep_create(sender->worker_->h(), &params, &sender->ep_);
    }
    if (s != UCS_OK) {
      sender->ep_ = nullptr;
      return absl::UnavailableError(absl::StrCat(
          "cannot connect to UCX address (", addr.size(),
          " bytes): ", ucs_status_string(s),
          "; is it a kvd node's transfer address, and do both sides allow "
          "the same UCX transports (UCX_TLS)?"));
    }
    return sender;
  }

  ~UcxSender() override {
    if (ep_ != nullptr) CloseEndpoint(/*force=*/!closed_);
  }

  absl::Status Send(absl::string_view chunk) override {
    if (closed_) return absl::FailedPreconditionError("Send after Close");
    return TagSend(chunk, kTagData);
  }

  absl::Status Close() override {
    if (closed_) return absl::OkStatus();
    absl::Status sent = TagSend(absl::string_view(), kTagEnd);
    closed_ = true;
    if (!sent.ok()) return sent;
    // A receiver that has taken the end may close its side at once, so a
    // flush can fail after a complete stream: whether everything arrived is
    // for the receiver to confirm (the control plane's commit), not this.
    ucp_request_param_t param{};
    absl::Status flushed =
        worker_->Complete(ucp_ep_flush_nbx(ep_, &param), "flush",
                          absl::Now() + send_timeout_, nullptr, &ep_status_);
    CloseEndpoint(/*force=*/!flushed.ok());
    return absl::OkStatus();
  }

 private:
  UcxSender(std::unique_ptr<Worker> worker, absl::Duration send_timeout)
      : worker_(std::move(worker)), send_timeout_(send_timeout) {}

  static void OnEndpointError(void* arg, ucp_ep_h, ucs_status_t status) {
    static_cast<UcxSender*>(arg)->ep_status_ = status;
  }

  absl::Status TagSend(absl::string_view bytes, ucp_tag_t tag) {
    if (ep_status_ != UCS_OK) {
      return UcxError("the stream (receiver gone?)", ep_status_);
    }
    ucp_request_param_t param{};
    ucs_status_ptr_t req =
        ucp_tag_send_nbx(ep_, bytes.data(), bytes.size(), tag, &param);
    return worker_->Complete(req, "send", absl::Now() + send_timeout_, nullptr,
                             &ep_status_);
  }

  void CloseEndpoint(bool force) {
    ucp_request_param_t param{};
    if (force || ep_status_ != UCS_OK) {
      param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      param.flags = UCP_EP_CLOSE_FLAG_FORCE;
    }
    worker_
        ->Complete(ucp_ep_close_nbx(ep_, &param), "close",
                   absl::Now() + absl::Seconds(1))
        .IgnoreError();
    ep_ = nullptr;
  }

  std::unique_ptr<Worker> worker_;
  const absl::Duration send_timeout_;
  ucp_ep_h ep_ = nullptr;
  ucs_status_t ep_status_ = UCS_OK;
  bool closed_ = false;
};

class UcxReceiver : public ChunkReceiver {
 public:
  static absl::StatusOr<std::unique_ptr<UcxReceiver>> Listen(
      std::shared_ptr<UcxTransport::Context> context,
      const ListenOptions& options) {
    absl::StatusOr<std::unique_ptr<Worker>> worker =
        Worker::Create(std::move(context));
    if (!worker.ok()) return worker.status();
    ucp_address_t* addr = nullptr;
    size_t len = 0;
    const ucs_status_t s = ucp_worker_get_address((*worker)->h(), &addr, &len);
    if (s != UCS_OK) return UcxError("worker address", s);
    std::string address(reinterpret_cast<const char*>(addr), len);
    ucp_worker_release_address((*worker)->h(), addr);
    return std::unique_ptr<UcxReceiver>(
        new UcxReceiver(std::move(*worker), std::move(address), options));
  }

  const std::string& address() const override { return address_; }

  absl::StatusOr<bool> Receive(std::string* chunk,
                               absl::Time deadline) override {
    if (!broken_.ok()) return broken_;
    if (ended_) return false;
    ucp_tag_recv_info_t info{};
    ucp_tag_message_h msg = nullptr;
    auto probed = [&] {
      msg = ucp_tag_probe_nb(worker_->h(), 0, 0, /*remove=*/1, &info);
      return msg != nullptr;
    };
    switch (worker_->ProgressUntil(probed, deadline, &cancelled_)) {
      case Wait::kDone:
        break;
      case Wait::kCancelled:
        return absl::CancelledError("transfer cancelled");
      case Wait::kDeadline:
        return absl::DeadlineExceededError(
            "no chunk arrived on the UCX stream in time");
    }
    if (static_cast<int64_t>(info.length) > options_.max_chunk_bytes) {
      broken_ = absl::ResourceExhaustedError(absl::StrCat(
          "a chunk of ", info.length, " bytes exceeds this stream's limit of ",
          options_.max_chunk_bytes));
      return broken_;
    }
    chunk->resize(info.length);
    ucp_request_param_t param{};
    absl::Status got =
        worker_->Complete(ucp_tag_msg_recv_nbx(worker_->h(), chunk->data(),
                                               chunk->size(), msg, &param),
                          "receive", deadline, &cancelled_);
    if (!got.ok()) {
      broken_ = got;
      return got;
    }
    if (info.sender_tag == kTagEnd) {
      ended_ = true;
      return false;
    }
    return true;
  }

  void Cancel() override { cancelled_ = true; }

 private:
  UcxReceiver(std::unique_ptr<Worker> worker, std::string address,
              ListenOptions options)
      : worker_(std::move(worker)),
        address_(std::move(address)),
        options_(options) {}

  std::unique_ptr<Worker> worker_;
  const std::string address_;
  const ListenOptions options_;
  std::atomic<bool> cancelled_{false};
  absl::Status broken_;
  bool ended_ = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<UcxTransport>> UcxTransport::Create(
    const UcxOptions& options) {
  ucp_config_t* config = nullptr;
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
  if (s != UCS_OK) return UcxError("config read", s);
  if (!options.tls.empty()) {
    s = ucp_config_modify(config, "TLS", options.tls.c_str());
    if (s != UCS_OK) {
      ucp_config_release(config);
      return absl::InvalidArgumentError(
          absl::StrCat("UCX transports '", options.tls,
                       "' are not valid UCX_TLS: ", ucs_status_string(s)));
    }
  }
  ucp_params_t params{};
  params.field_mask =
      UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 1;
  auto context = std::make_shared<Context>();
  s = ucp_init(&params, config, &context->h);
  ucp_config_release(config);
  if (s != UCS_OK) {
    context->h = nullptr;
    return absl::UnavailableError(absl::StrCat(
        "UCX could not start with transports '",
        options.tls.empty() ? "(default)" : options.tls, "': ",
        ucs_status_string(s), " (ucx_info -d lists what this machine has)"));
  }
  return std::unique_ptr<UcxTransport>(
      new UcxTransport(options, std::move(context)));
}

UcxTransport::UcxTransport(UcxOptions options, std::shared_ptr<Context> context)
    : options_(std::move(options)), context_(std::move(context)) {}

UcxTransport::~UcxTransport() = default;

std::string UcxTransport::name() const {
  return absl::StrCat("ucx(", options_.tls.empty() ? "default" : options_.tls,
                      ")");
}

absl::StatusOr<std::unique_ptr<ChunkReceiver>> UcxTransport::Listen(
    const ListenOptions& options) {
  absl::StatusOr<std::unique_ptr<UcxReceiver>> r =
      UcxReceiver::Listen(context_, options);
  if (!r.ok()) return r.status();
  return std::unique_ptr<ChunkReceiver>(std::move(*r));
}

absl::StatusOr<std::unique_ptr<ChunkSender>> UcxTransport::Connect(
    absl::string_view address) {
  if (address.empty()) {
    return absl::InvalidArgumentError("empty UCX address");
  }
  absl::StatusOr<std::unique_ptr<UcxSender>> s =
      UcxSender::Connect(context_, address, options_);
  if (!s.ok()) return s.status();
  return std::unique_ptr<ChunkSender>(std::move(*s));
}

}  // namespace kvd::transport
