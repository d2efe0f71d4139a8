// A test double of the node's fence (services/node/cluster_member.h),
// reduced to its directory checks over a real etcd directory: no lease. For
// tests and benchmarks that run engines in one process as cluster nodes.
//
// Thread-safety: as SessionDirectory.
#ifndef KVD_SERVICES_MIGRATION_TESTING_DIRECTORY_FENCE_FOR_TEST_H_
#define KVD_SERVICES_MIGRATION_TESTING_DIRECTORY_FENCE_FOR_TEST_H_

#include <cstdint>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "services/cluster/directory.h"
#include "services/engine/session_fence.h"

namespace kvd::migration::testing {

class DirectoryFenceForTest : public engine::SessionFence {
 public:
  DirectoryFenceForTest(cluster::SessionDirectory* dir, std::string node)
      : dir_(dir), node_(std::move(node)) {}

  absl::StatusOr<uint64_t> OwnedEpoch(const std::string& tenant,
                                      const std::string& session) override {
    auto e = dir_->Lookup(tenant, session);
    if (!e.ok()) return e.status();
    if (!e->has_value()) return absl::NotFoundError("not in the directory");
    if ((*e)->owner != node_) {
      return absl::AbortedError(absl::StrCat("moved to ", (*e)->owner));
    }
    return (*e)->epoch;
  }

  absl::Status MayCommit(const std::string& tenant, const std::string& session,
                         uint64_t epoch) override {
    absl::StatusOr<uint64_t> owned = OwnedEpoch(tenant, session);
    if (!owned.ok()) return owned.status();
    if (*owned != epoch) return absl::AbortedError("epoch moved on");
    return absl::OkStatus();
  }

 private:
  cluster::SessionDirectory* const dir_;
  const std::string node_;
};

}  // namespace kvd::migration::testing

#endif  // KVD_SERVICES_MIGRATION_TESTING_DIRECTORY_FENCE_FOR_TEST_H_
