#include "storage/checkpoint/ownership.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvd::storage {
namespace {

using ::testing::HasSubstr;

v1::SessionManifest Manifest(const std::string& owner, uint64_t epoch,
                             v1::SessionRole role = v1::SESSION_ROLE_PRIMARY) {
  v1::SessionManifest m;
  m.set_tenant("acme");
  m.set_session_id("chat-1");
  m.set_owner_node(owner);
  m.set_epoch(epoch);
  m.set_role(role);
  return m;
}

TEST(OwnershipTest, FormatOneManifestIsEpochOneOfNoNode) {
  v1::SessionManifest old;  // format 1: no ownership fields
  EXPECT_EQ(EpochOf(old), kFirstEpoch);
  EXPECT_FALSE(IsReplica(old));
  // Any node takes it at epoch 1 with its first commit; not at another.
  EXPECT_TRUE(CheckTurnFence(old, Manifest("n1", 1)).ok());
  EXPECT_TRUE(CheckTurnFence(old, Manifest("", 1)).ok());
  EXPECT_EQ(CheckTurnFence(old, Manifest("n1", 2)).code(),
            absl::StatusCode::kAborted);
  // An owned session is not taken by a standalone node.
  EXPECT_EQ(CheckTurnFence(Manifest("n1", 1), Manifest("", 1)).code(),
            absl::StatusCode::kAborted);
}

TEST(OwnershipTest, AnImportIsANewPrimaryOneEpochOn) {
  const v1::SessionManifest imported =
      ImportedBy(Manifest("n1", 3, v1::SESSION_ROLE_REPLICA), "n2");
  EXPECT_EQ(imported.owner_node(), "n2");
  EXPECT_EQ(imported.epoch(), 4u);
  EXPECT_FALSE(IsReplica(imported));
  EXPECT_EQ(ImportedBy(v1::SessionManifest(), "").epoch(), 2u);
}

TEST(OwnershipTest, TurnsCommitOnlyUnderTheStoredEpochAndOwner) {
  const v1::SessionManifest stored = Manifest("n1", 3);
  EXPECT_TRUE(CheckTurnFence(stored, Manifest("n1", 3)).ok());
  const absl::Status stale = CheckTurnFence(stored, Manifest("n1", 2));
  EXPECT_EQ(stale.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(stale.message(), HasSubstr("moved"));
  EXPECT_THAT(stale.message(), HasSubstr("epoch 3 owned by node 'n1'"));
  EXPECT_THAT(stale.message(), HasSubstr("Nothing was written"));
  EXPECT_EQ(CheckTurnFence(stored, Manifest("n2", 3)).code(),
            absl::StatusCode::kAborted);
  // A newer epoch is an ownership change, never a turn.
  EXPECT_EQ(CheckTurnFence(stored, Manifest("n1", 4)).code(),
            absl::StatusCode::kAborted);
  const absl::Status replica = CheckTurnFence(
      Manifest("n2", 4, v1::SESSION_ROLE_REPLICA), Manifest("n2", 4));
  EXPECT_EQ(replica.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(replica.message(), HasSubstr("replica"));
}

TEST(OwnershipTest, OwnershipOnlyMovesForward) {
  const v1::SessionManifest stored = Manifest("n1", 3);
  EXPECT_TRUE(CheckOwnershipChange(stored, Manifest("n2", 4)).ok());
  EXPECT_EQ(CheckOwnershipChange(stored, Manifest("n2", 3)).code(),
            absl::StatusCode::kAborted);
  EXPECT_EQ(CheckOwnershipChange(stored, Manifest("n2", 2)).code(),
            absl::StatusCode::kAborted);
  // Released to n2 at epoch 4, n2 takes its copy up at the same epoch.
  const v1::SessionManifest released =
      Manifest("n2", 4, v1::SESSION_ROLE_REPLICA);
  EXPECT_TRUE(CheckOwnershipChange(released, Manifest("n2", 4)).ok());
  EXPECT_EQ(CheckOwnershipChange(released, Manifest("n1", 4)).code(),
            absl::StatusCode::kAborted);
}

TEST(OwnershipTest, AReplicaTakesOnlyLaterTurnsOfItsOwnerAtItsEpoch) {
  constexpr auto kReplica = v1::SESSION_ROLE_REPLICA;
  v1::SessionManifest stored = Manifest("n1", 2, kReplica);
  stored.set_token_count(10);
  stored.add_turn_ends(10);
  v1::SessionManifest next = stored;
  next.set_token_count(20);
  next.add_turn_ends(20);
  EXPECT_TRUE(CheckReplicaUpdate(stored, next).ok());
  EXPECT_TRUE(CheckReplicaUpdate(stored, stored).ok());  // nothing new
  // Not onto a primary, not as a primary, not from another owner or epoch,
  // and never backwards.
  EXPECT_EQ(CheckReplicaUpdate(Manifest("n1", 2), next).code(),
            absl::StatusCode::kAborted);
  v1::SessionManifest primary = next;
  primary.set_role(v1::SESSION_ROLE_PRIMARY);
  EXPECT_EQ(CheckReplicaUpdate(stored, primary).code(),
            absl::StatusCode::kAborted);
  v1::SessionManifest other = next;
  other.set_owner_node("n9");
  EXPECT_EQ(CheckReplicaUpdate(stored, other).code(),
            absl::StatusCode::kAborted);
  v1::SessionManifest later = next;
  later.set_epoch(3);
  EXPECT_EQ(CheckReplicaUpdate(stored, later).code(),
            absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(CheckReplicaUpdate(next, stored).message()),
              HasSubstr("would replace"));
}

}  // namespace
}  // namespace kvd::storage
