// The cluster's session directory in etcd: /kvd/v1/sessions/TENANT/SESSION
// -> its owner node, its fencing epoch (the manifest's, which the owner's
// conditional commits check: storage/checkpoint/ownership.h), its replicas
// and its state. Every change is an etcd transaction on the entry's
// revision, so of two routers or nodes racing to place or move a session
// exactly one wins, and a move always raises the epoch.
//
//   SessionDirectory dir(etcd.get());
//   KVD_ASSIGN_OR_RETURN(DirectoryEntry e, dir.Create("acme", "c1", "n1"));
//   KVD_ASSIGN_OR_RETURN(e, dir.Move("acme", "c1", e, "n2"));  // epoch 2
//
// Thread-safety: as EtcdClient.
#ifndef KVD_SERVICES_CLUSTER_DIRECTORY_H_
#define KVD_SERVICES_CLUSTER_DIRECTORY_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "services/cluster/etcd_client.h"

namespace kvd::cluster {

inline constexpr char kSessionsPrefix[] = "/kvd/v1/sessions/";

struct DirectoryEntry {
  std::string owner;  // node id
  uint64_t epoch = 0;
  std::vector<std::string> replicas;
  std::string state = "active";  // "active", "moving"
  int64_t mod_revision = 0;      // the entry's etcd revision, for Move
};

// A directory entry's value as stored under `kv.key`; DATA_LOSS if it does
// not parse as one.
absl::StatusOr<DirectoryEntry> DecodeDirectoryEntry(const EtcdKeyValue& kv);

class SessionDirectory {
 public:
  explicit SessionDirectory(EtcdClient* etcd) : etcd_(etcd) {}

  // The session's entry, or nullopt if the directory has none. DATA_LOSS for
  // an entry that does not parse.
  absl::StatusOr<std::optional<DirectoryEntry>> Lookup(
      const std::string& tenant, const std::string& session);
  // Assigns a new session to `owner` at epoch 1. ALREADY_EXISTS if the
  // directory has it (someone else placed it first: Lookup and follow).
  absl::StatusOr<DirectoryEntry> Create(const std::string& tenant,
                                        const std::string& session,
                                        const std::string& owner);
  // Moves the session to `to` at `expected.epoch + 1`, if its entry is
  // still `expected` (same revision), with no replicas (theirs are copies
  // of the old epoch). ABORTED if it changed meanwhile.
  absl::StatusOr<DirectoryEntry> Move(const std::string& tenant,
                                      const std::string& session,
                                      const DirectoryEntry& expected,
                                      const std::string& to);

  // Replaces the session's replica list (same owner and epoch) if its entry
  // is still `expected`. ABORTED if it changed meanwhile.
  absl::StatusOr<DirectoryEntry> SetReplicas(const std::string& tenant,
                                             const std::string& session,
                                             const DirectoryEntry& expected,
                                             std::vector<std::string> replicas);

  // Removes the session's entry if it is still `expected` (its owner
  // deleted the session). ABORTED if it changed meanwhile.
  absl::Status Remove(const std::string& tenant, const std::string& session,
                      const DirectoryEntry& expected);
  // The tenant's sessions (id -> entry), in id order.
  absl::StatusOr<std::vector<std::pair<std::string, DirectoryEntry>>> List(
      const std::string& tenant);

  // Every session `owner` owns, across tenants, in key order (a drain's
  // work list).
  struct OwnedSession {
    std::string tenant;
    std::string session;
    DirectoryEntry entry;
  };
  absl::StatusOr<std::vector<OwnedSession>> ListOwnedBy(
      const std::string& owner);
  // Every session `node` owns or is a listed replica of, in key order (what
  // a node must hold a copy of).
  absl::StatusOr<std::vector<OwnedSession>> ListHeldBy(const std::string& node);

  static std::string Key(const std::string& tenant, const std::string& session);

 private:
  absl::StatusOr<std::vector<OwnedSession>> ListWhere(
      const std::function<bool(const DirectoryEntry&)>& keep);
  // Writes `next` if the entry is still `expected`; the entry as written.
  absl::StatusOr<DirectoryEntry> Replace(const std::string& tenant,
                                         const std::string& session,
                                         const DirectoryEntry& expected,
                                         const DirectoryEntry& next);

  EtcdClient* const etcd_;
};

}  // namespace kvd::cluster

#endif  // KVD_SERVICES_CLUSTER_DIRECTORY_H_
