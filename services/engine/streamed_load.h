// Reads a session's checkpoint on a thread of its own and hands the caller
// each stream (the token ids, then layer by layer) as soon as storage has
// read and checked it, so a resume from disk can rebuild layer 0's K/V while
// later layers are still being read (reading and
// recomputing overlap instead of following each other).
//
//   StreamedLoad load(store, "acme", "chat-1");
//   if (const v1::SessionManifest* m = load.WaitManifest()) {
//     auto tokens = load.WaitStream(storage::kTokenLayer);
//     ...  // then WaitStream(layer) for each layer, in ascending order
//   }
//   absl::StatusOr<storage::TieredStore::Loaded> loaded = load.Finish();
//
// A DRAM hit streams nothing (WaitManifest returns null) and Finish returns
// the checkpoint, as TieredStore::Load would. What was streamed is what
// storage read; if the session changed meanwhile, Finish returns the newer
// copy (DramTier::GetOrLoad) with Loaded::observed false.
//
// Until Finish the loader holds its RocksDB snapshot and every chunk read,
// and the DRAM tier gets the checkpoint only then: another Load of the same
// session meanwhile reads RocksDB again.
//
// Thread-safety: one caller thread, besides the loader. The streams stay
// valid until Finish, which the destructor calls if the caller did not.
#ifndef KVD_SERVICES_ENGINE_STREAMED_LOAD_H_
#define KVD_SERVICES_ENGINE_STREAMED_LOAD_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "proto/kvd/v1/checkpoint.pb.h"
#include "storage/checkpoint/session_checkpoint.h"
#include "storage/tiered/tiered_store.h"

namespace kvd::engine {

class StreamedLoad final : private storage::LoadObserver {
 public:
  using Chunks = std::map<storage::ChunkId, std::string>;

  // Starts the load. `store` must outlive this.
  StreamedLoad(storage::TieredStore* store, std::string tenant,
               std::string session);
  ~StreamedLoad();

  // Waits until the load has read the manifest, or ended without one (a
  // DRAM hit, or an error first): the manifest then, else null.
  const v1::SessionManifest* WaitManifest();
  // Waits until stream `layer` (storage::kTokenLayer, or a stored layer; in
  // ascending order) is read and checked: its chunks, empty if the manifest
  // needs none of them, valid until Finish. The load's error if it failed
  // first (DATA_LOSS naming the chunk, ...).
  absl::StatusOr<const Chunks*> WaitStream(int64_t layer);
  // Whether WaitStream(layer) would return at once (the stream arrived, or
  // the load ended): a caller with other work polls instead of blocking.
  bool Arrived(int64_t layer);
  // Lets go of the streams and waits for the load to end: what
  // TieredStore::Load returned. Once.
  absl::StatusOr<storage::TieredStore::Loaded> Finish();

  StreamedLoad(const StreamedLoad&) = delete;
  StreamedLoad& operator=(const StreamedLoad&) = delete;

 private:
  void OnManifest(const v1::SessionManifest& manifest) override;
  void OnStream(int64_t layer, const Chunks& chunks) override;
  void OnEnd(const absl::Status& status) override;
  bool ArrivedLocked(int64_t layer) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  bool has_manifest_ ABSL_GUARDED_BY(mu_) = false;
  v1::SessionManifest manifest_ ABSL_GUARDED_BY(mu_);
  // Streams read so far, by layer; owned by the loader until OnEnd returns.
  std::map<int64_t, const Chunks*> streams_ ABSL_GUARDED_BY(mu_);
  bool ended_ ABSL_GUARDED_BY(mu_) = false;  // OnEnd, or Load returned
  absl::Status end_status_ ABSL_GUARDED_BY(mu_);
  bool released_ ABSL_GUARDED_BY(mu_) = false;  // Finish: OnEnd may return
  std::optional<absl::StatusOr<storage::TieredStore::Loaded>> result_;
  std::thread loader_;
};

}  // namespace kvd::engine

#endif  // KVD_SERVICES_ENGINE_STREAMED_LOAD_H_
