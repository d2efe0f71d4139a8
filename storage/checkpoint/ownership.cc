#include "storage/checkpoint/ownership.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "storage/checkpoint/codec.h"

namespace kvd::storage {
namespace {

std::string Name(const v1::SessionManifest& m) {
  return absl::StrCat("session '", m.session_id(), "' of tenant '", m.tenant(),
                      "'");
}

}  // namespace

std::string OwnerName(const std::string& node) {
  return node.empty() ? "a standalone node" : absl::StrCat("node '", node, "'");
}

uint64_t EpochOf(const v1::SessionManifest& m) {
  return m.epoch() == 0 ? kFirstEpoch : m.epoch();
}

bool IsReplica(const v1::SessionManifest& m) {
  return m.role() == v1::SESSION_ROLE_REPLICA;
}

absl::Status CheckTurnFence(const v1::SessionManifest& stored,
                            const v1::SessionManifest& next) {
  if (IsReplica(stored)) {
    return absl::AbortedError(absl::StrCat(
        Name(stored), " is only a replica copy here; its primary is ",
        OwnerName(stored.owner_node()), " at epoch ", EpochOf(stored),
        ": send the turn there. Nothing was written"));
  }
  // An unowned session (a standalone node's, or format 1) is taken, at its
  // epoch, by whoever commits to it.
  const bool owner_ok =
      stored.owner_node() == next.owner_node() || stored.owner_node().empty();
  if (EpochOf(next) != EpochOf(stored) || !owner_ok) {
    return absl::AbortedError(absl::StrCat(
        Name(stored), " moved: it is at epoch ", EpochOf(stored), " owned by ",
        OwnerName(stored.owner_node()), ", and this node holds epoch ",
        EpochOf(next), " as ", OwnerName(next.owner_node()),
        ". Nothing was written; send the turn to where the session lives "
        "now"));
  }
  return absl::OkStatus();
}

absl::Status CheckOwnershipChange(const v1::SessionManifest& stored,
                                  const v1::SessionManifest& next) {
  if (EpochOf(next) > EpochOf(stored)) return absl::OkStatus();
  if (EpochOf(next) == EpochOf(stored) &&
      next.owner_node() == stored.owner_node()) {
    return absl::OkStatus();  // the named owner takes up its copy
  }
  return absl::AbortedError(
      absl::StrCat(Name(stored), " is at epoch ", EpochOf(stored), " owned by ",
                   OwnerName(stored.owner_node()), "; a change of owner to ",
                   OwnerName(next.owner_node()), " at epoch ", EpochOf(next),
                   " is stale (epochs only grow). Nothing was written"));
}

absl::Status CheckReplicaUpdate(const v1::SessionManifest& stored,
                                const v1::SessionManifest& next) {
  if (!IsReplica(stored) || !IsReplica(next)) {
    return absl::AbortedError(absl::StrCat(
        Name(stored), " is ", IsReplica(stored) ? "a replica" : "a primary",
        " here; only a replica copy takes another node's turns. Nothing was "
        "written"));
  }
  if (EpochOf(next) != EpochOf(stored) ||
      next.owner_node() != stored.owner_node()) {
    return absl::AbortedError(absl::StrCat(
        Name(stored), " is a replica of ", OwnerName(stored.owner_node()),
        " at epoch ", EpochOf(stored), "; an update from ",
        OwnerName(next.owner_node()), " at epoch ", EpochOf(next),
        " does not follow it. Nothing was written"));
  }
  if (next.turn_ends_size() < stored.turn_ends_size() ||
      next.token_count() < stored.token_count()) {
    return absl::AbortedError(
        absl::StrCat(Name(stored), ": an update with ", next.turn_ends_size(),
                     " turns would replace a replica copy with ",
                     stored.turn_ends_size(), ". Nothing was written"));
  }
  return absl::OkStatus();
}

v1::SessionManifest ImportedBy(const v1::SessionManifest& m,
                               const std::string& node) {
  v1::SessionManifest out = m;
  out.set_format_version(kCheckpointFormatVersion);
  out.set_owner_node(node);
  out.set_epoch(EpochOf(m) + 1);
  out.set_role(v1::SESSION_ROLE_PRIMARY);
  return out;
}

}  // namespace kvd::storage
