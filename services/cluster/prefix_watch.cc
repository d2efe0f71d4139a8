#include "services/cluster/prefix_watch.h"

#include <algorithm>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace kvd::cluster {
PrefixWatch::PrefixWatch(EtcdClient* etcd, Options options)
    : etcd_(etcd), options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<PrefixWatch>> PrefixWatch::Start(
    EtcdClient* etcd, Options options) {
  std::unique_ptr<PrefixWatch> w(new PrefixWatch(etcd, std::move(options)));
  absl::Status loaded = w->Load();
  if (!loaded.ok()) return loaded;
  w->thread_ = std::thread([p = w.get()] { p->Loop(); });
  return w;
}

PrefixWatch::~PrefixWatch() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    if (stream_ctx_ != nullptr) stream_ctx_->TryCancel();
  }
  if (thread_.joinable()) thread_.join();
}

std::map<std::string, EtcdKeyValue> PrefixWatch::Snapshot() const {
  absl::MutexLock lock(&mu_);
  return kvs_;
}

int64_t PrefixWatch::revision() const {
  absl::MutexLock lock(&mu_);
  return revision_;
}

bool PrefixWatch::Stopping() {
  absl::MutexLock lock(&mu_);
  return stop_;
}

absl::Status PrefixWatch::Load() {
  int64_t revision = 0;
  absl::StatusOr<std::vector<EtcdKeyValue>> kvs =
      etcd_->GetPrefix(options_.prefix, &revision);
  if (!kvs.ok()) return kvs.status();
  {
    absl::MutexLock lock(&mu_);
    kvs_.clear();
    for (EtcdKeyValue& kv : *kvs) kvs_[kv.key] = std::move(kv);
    revision_ = revision;
  }
  if (options_.on_change) options_.on_change();
  if (options_.after_load_for_test) options_.after_load_for_test();
  return absl::OkStatus();
}

absl::Status PrefixWatch::WatchOnce() {
  grpc::ClientContext ctx;
  int64_t from = 0;
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return absl::CancelledError("stopping");
    stream_ctx_ = &ctx;
    from = revision_ + 1;
  }
  struct Clear {
    PrefixWatch* w;
    ~Clear() {
      absl::MutexLock lock(&w->mu_);
      w->stream_ctx_ = nullptr;
    }
  } clear{this};
  auto stream = etcd_->OpenWatch(&ctx);
  etcdserverpb::WatchRequest req;
  etcdserverpb::WatchCreateRequest* create = req.mutable_create_request();
  create->set_key(options_.prefix);
  create->set_range_end(PrefixRangeEnd(options_.prefix));
  create->set_start_revision(from);
  // Idle watches get progress notices, so the resume point follows the
  // store even when this prefix does not change.
  create->set_progress_notify(true);
  if (!stream->Write(req)) {
    return absl::UnavailableError(
        absl::StrCat("etcd at ", etcd_->endpoint(), ": cannot open a watch"));
  }
  etcdserverpb::WatchResponse resp;
  while (stream->Read(&resp)) {
    if (resp.compact_revision() > 0) {
      ctx.TryCancel();
      return absl::AbortedError(absl::StrCat(
          "revision ", from, " was compacted (history now starts at ",
          resp.compact_revision(), ")"));
    }
    if (resp.canceled()) {
      ctx.TryCancel();
      return absl::UnavailableError(
          absl::StrCat("etcd cancelled the watch: ", resp.cancel_reason()));
    }
    if (resp.created()) {
      synced_.store(true);
      continue;
    }
    {
      absl::MutexLock lock(&mu_);
      for (const mvccpb::Event& e : resp.events()) {
        const mvccpb::KeyValue& kv = e.kv();
        if (e.type() == mvccpb::Event::DELETE) {
          kvs_.erase(kv.key());
        } else {
          kvs_[kv.key()] = FromProto(kv);
        }
        revision_ = std::max(revision_, kv.mod_revision());
      }
      // A response without events is a progress notice: every change up to
      // its revision has been delivered.
      if (resp.events_size() == 0) {
        revision_ = std::max(revision_, resp.header().revision());
      }
    }
    if (resp.events_size() > 0 && options_.on_change) options_.on_change();
  }
  const grpc::Status finished = stream->Finish();
  return absl::UnavailableError(
      absl::StrCat("etcd at ", etcd_->endpoint(),
                   ": watch stream ended: ", finished.error_message()));
}

void PrefixWatch::Loop() {
  std::mt19937_64 rng(std::random_device{}());
  absl::Duration backoff = absl::Milliseconds(50);
  bool reload = false;
  while (!Stopping()) {
    absl::Status s = reload ? Load() : WatchOnce();
    if (Stopping()) return;
    if (reload && s.ok()) {
      reload = false;
      resyncs_.fetch_add(1);
      continue;
    }
    if (s.code() == absl::StatusCode::kAborted) {
      reload = true;  // compacted: start over from the current state
      continue;
    }
    // A watch that was up before it ended starts over with a short delay.
    if (synced_.exchange(false)) backoff = absl::Milliseconds(50);
    // etcd down or restarting: come back with jittered, growing delays so a
    // cluster's routers do not all return in the same instant.
    std::uniform_real_distribution<double> jitter(0.5, 1.5);
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&stop_), backoff * jitter(rng));
    backoff = std::min(backoff * 2, absl::Seconds(2));
  }
}

}  // namespace kvd::cluster
