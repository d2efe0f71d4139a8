// A live copy of every key under an etcd prefix, kept current by a watch:
// how routers follow membership (/kvd/v1/nodes/) without asking etcd on
// every request. The watch resumes from the last revision it applied after
// a dropped stream or an etcd restart, so no change is missed; when etcd
// has compacted that revision away it reloads the whole prefix instead
// (resyncs()). While etcd is unreachable the copy is kept but marked stale
// (synced() false), so callers can decide how far to trust it.
//
//   PrefixWatch::Options o;
//   o.prefix = kNodesPrefix;
//   KVD_ASSIGN_OR_RETURN(auto nodes, PrefixWatch::Start(etcd.get(), o));
//   for (const auto& [key, kv] : nodes->Snapshot()) ...
//
// Thread-safety: all methods may be called concurrently; on_change runs on
// the watch's thread.
#ifndef KVD_SERVICES_CLUSTER_PREFIX_WATCH_H_
#define KVD_SERVICES_CLUSTER_PREFIX_WATCH_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "services/cluster/etcd_client.h"

namespace kvd::cluster {

class PrefixWatch {
 public:
  struct Options {
    std::string prefix;
    // After each applied batch of changes (or a reload).
    std::function<void()> on_change;
    // Test hook: runs after every (re)load of the prefix and before the
    // watch that follows it starts, so a test can change and compact the
    // store in between.
    std::function<void()> after_load_for_test;
  };

  // Loads the prefix (so Snapshot() is complete on return) and starts
  // watching; UNAVAILABLE if etcd cannot be read.
  static absl::StatusOr<std::unique_ptr<PrefixWatch>> Start(EtcdClient* etcd,
                                                            Options options);
  ~PrefixWatch();

  // key -> its current value, as of revision().
  std::map<std::string, EtcdKeyValue> Snapshot() const;
  // The store revision the copy reflects.
  int64_t revision() const;
  // False while the watch is down (etcd unreachable): the copy may be stale.
  bool synced() const { return synced_.load(); }
  // Whole-prefix reloads after etcd compacted the revision to resume from.
  int64_t resyncs() const { return resyncs_.load(); }

 private:
  PrefixWatch(EtcdClient* etcd, Options options);
  absl::Status Load();
  // Watches from revision() + 1 until the stream ends: ABORTED when that
  // revision is compacted (reload), else why it ended.
  absl::Status WatchOnce();
  void Loop();
  bool Stopping();

  EtcdClient* const etcd_;
  const Options options_;
  mutable absl::Mutex mu_;
  std::map<std::string, EtcdKeyValue> kvs_ ABSL_GUARDED_BY(mu_);
  int64_t revision_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* stream_ctx_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::atomic<bool> synced_{false};
  std::atomic<int64_t> resyncs_{0};
  std::thread thread_;
};

}  // namespace kvd::cluster

#endif  // KVD_SERVICES_CLUSTER_PREFIX_WATCH_H_
