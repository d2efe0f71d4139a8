#include "services/engine/streamed_load.h"

#include <utility>

namespace kvd::engine {

StreamedLoad::StreamedLoad(storage::TieredStore* store, std::string tenant,
                           std::string session) {
  loader_ = std::thread(
      [this, store, tenant = std::move(tenant), session = std::move(session)] {
        absl::StatusOr<storage::TieredStore::Loaded> loaded =
            store->Load(tenant, session, this);
        absl::MutexLock lock(&mu_);
        // A hit or an early failure calls no observer method: end here.
        if (!ended_) end_status_ = loaded.status();
        ended_ = true;
        result_ = std::move(loaded);
      });
}

StreamedLoad::~StreamedLoad() {
  if (loader_.joinable()) Finish().IgnoreError();
}

const v1::SessionManifest* StreamedLoad::WaitManifest() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](StreamedLoad* s) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return s->has_manifest_ || s->ended_;
      },
      this));
  // Written once, before any stream; stable until Finish.
  return has_manifest_ ? &manifest_ : nullptr;
}

absl::StatusOr<const StreamedLoad::Chunks*> StreamedLoad::WaitStream(
    int64_t layer) {
  absl::MutexLock lock(&mu_);
  struct Wait {
    StreamedLoad* load;
    int64_t layer;
  } wait{this, layer};
  mu_.Await(absl::Condition(
      +[](Wait* w) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return w->load->ArrivedLocked(w->layer);
      },
      &wait));
  if (auto it = streams_.find(layer); it != streams_.end()) return it->second;
  if (!end_status_.ok()) return end_status_;
  static const Chunks* const kNone = new Chunks();
  return kNone;
}

bool StreamedLoad::Arrived(int64_t layer) {
  absl::MutexLock lock(&mu_);
  return ArrivedLocked(layer);
}

bool StreamedLoad::ArrivedLocked(int64_t layer) const {
  // Streams come in ascending order: one past `layer` means it had nothing.
  return ended_ || (!streams_.empty() && streams_.rbegin()->first >= layer);
}

absl::StatusOr<storage::TieredStore::Loaded> StreamedLoad::Finish() {
  {
    absl::MutexLock lock(&mu_);
    released_ = true;
  }
  loader_.join();
  return *std::move(result_);
}

void StreamedLoad::OnManifest(const v1::SessionManifest& manifest) {
  absl::MutexLock lock(&mu_);
  manifest_ = manifest;
  has_manifest_ = true;
}

void StreamedLoad::OnStream(int64_t layer, const Chunks& chunks) {
  absl::MutexLock lock(&mu_);
  streams_[layer] = &chunks;
}

void StreamedLoad::OnEnd(const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  end_status_ = status;
  ended_ = true;
  // The chunks stay the loader's until the caller is done with them.
  mu_.Await(absl::Condition(&released_));
  streams_.clear();
}

}  // namespace kvd::engine
