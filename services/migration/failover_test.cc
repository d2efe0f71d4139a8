// The failover controller against a real etcd: who leads, which sessions it
// promotes, and to which replica. Replicas' copies are described by a test
// double (ReplicaStatusTableForTest) instead of nodes serving them: what is
// under test is the choice, not the transfer (replicator_test and
// tests/cluster cover those).
#include "services/migration/failover.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "services/cluster/directory.h"
#include "services/cluster/membership.h"
#include "services/cluster/testing/etcd_test.h"

namespace kvd::migration {
namespace {

// What each (node, tenant, session) would answer to ReplicaStatus; a node
// absent from the table is unreachable. Records every question.
class ReplicaStatusTableForTest {
 public:
  void Set(const std::string& node, const std::string& owner, uint64_t epoch,
           int64_t turns) {
    v1::ReplicaStatusResponse r;
    r.set_owner_node(owner);
    r.set_epoch(epoch);
    r.set_turns(turns);
    copies_[node] = r;
  }
  ReplicaStatusFn Fn() {
    return [this](const std::string& node, const std::string& tenant,
                  const std::string& session)
               -> absl::StatusOr<v1::ReplicaStatusResponse> {
      asked_.push_back(absl::StrCat(node, ":", tenant, "/", session));
      auto it = copies_.find(node);
      if (it == copies_.end()) {
        return absl::UnavailableError(absl::StrCat(node, " is unreachable"));
      }
      return it->second;
    };
  }
  const std::vector<std::string>& asked() const { return asked_; }

 private:
  std::map<std::string, v1::ReplicaStatusResponse> copies_;
  std::vector<std::string> asked_;
};

class FailoverTest : public cluster::testing::EtcdTest {
 protected:
  void SetUp() override {
    EtcdTest::SetUp();
    if (HasFatalFailure()) return;
    directory_ = std::make_unique<cluster::SessionDirectory>(client_.get());
  }

  std::unique_ptr<cluster::EtcdClient> Connect() {
    auto client = cluster::EtcdClient::Connect(
        {.endpoint = etcd_->endpoint(), .retry_for = absl::Seconds(1)});
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? std::move(*client) : nullptr;
  }

  // A live member: what the controller reads membership from.
  void Live(const std::string& node) {
    ASSERT_TRUE(
        client_->Put(absl::StrCat(cluster::kNodesPrefix, node), "{}").ok());
  }

  // A session owned by `owner` at epoch 1 with `replicas` listed.
  cluster::DirectoryEntry Session(const std::string& session,
                                  const std::string& owner,
                                  std::vector<std::string> replicas) {
    absl::StatusOr<cluster::DirectoryEntry> e =
        directory_->Create("acme", session, owner);
    EXPECT_TRUE(e.ok()) << e.status();
    e = directory_->SetReplicas("acme", session, *e, std::move(replicas));
    EXPECT_TRUE(e.ok()) << e.status();
    return *e;
  }

  cluster::DirectoryEntry Entry(const std::string& session) {
    absl::StatusOr<std::optional<cluster::DirectoryEntry>> e =
        directory_->Lookup("acme", session);
    EXPECT_TRUE(e.ok() && e->has_value());
    return e.ok() && e->has_value() ? **e : cluster::DirectoryEntry{};
  }

  std::unique_ptr<FailoverController> Controller(cluster::EtcdClient* etcd,
                                                 const std::string& node) {
    return std::make_unique<FailoverController>(
        etcd, directory_.get(), replicas_.Fn(),
        FailoverOptions{.node_id = node, .lease_ttl = absl::Seconds(5)});
  }

  std::unique_ptr<cluster::SessionDirectory> directory_;
  ReplicaStatusTableForTest replicas_;
};

TEST_F(FailoverTest, OneControllerLeadsAndAnotherTakesOverWhenItGoes) {
  std::unique_ptr<cluster::EtcdClient> other_client = Connect();
  ASSERT_NE(other_client, nullptr);
  std::unique_ptr<FailoverController> a = Controller(client_.get(), "a");
  std::unique_ptr<FailoverController> b = Controller(other_client.get(), "b");
  ASSERT_TRUE(a->Pass().ok());
  ASSERT_TRUE(b->Pass().ok());
  EXPECT_TRUE(a->stats().leader);
  EXPECT_FALSE(b->stats().leader);
  // Still so on the next passes: the holder renews, the other keeps out.
  ASSERT_TRUE(b->Pass().ok());
  ASSERT_TRUE(a->Pass().ok());
  EXPECT_TRUE(a->stats().leader);
  EXPECT_FALSE(b->stats().leader);

  a.reset();  // revokes its lease: the key goes with it
  ASSERT_TRUE(b->Pass().ok());
  EXPECT_TRUE(b->stats().leader);
}

TEST_F(FailoverTest, ANonLeaderPromotesNothing) {
  std::unique_ptr<cluster::EtcdClient> other_client = Connect();
  ASSERT_NE(other_client, nullptr);
  std::unique_ptr<FailoverController> a = Controller(client_.get(), "a");
  ASSERT_TRUE(a->Pass().ok());  // a leads
  Live("b");
  Session("s1", "gone", {"b"});
  replicas_.Set("b", "gone", 1, 3);
  std::unique_ptr<FailoverController> b = Controller(other_client.get(), "b");
  absl::StatusOr<int> promoted = b->Pass();
  ASSERT_TRUE(promoted.ok()) << promoted.status();
  EXPECT_EQ(*promoted, 0);
  EXPECT_TRUE(replicas_.asked().empty());
  EXPECT_EQ(Entry("s1").owner, "gone");
}

TEST_F(FailoverTest, PromotesTheLiveReplicaWithTheMostTurnsOfTheOwnersEpoch) {
  Live("b");
  Live("c");
  Live("d");
  // The owner "gone" is not live. Its replicas: b holds 5 turns of epoch 1;
  // c holds 7 but of another owner's epoch (a stale copy: never promoted);
  // d is live but unreachable; e holds 9 but is not live.
  Session("s1", "gone", {"b", "c", "d", "e"});
  replicas_.Set("b", "gone", 1, 5);
  replicas_.Set("c", "other", 1, 7);
  replicas_.Set("e", "gone", 1, 9);

  std::unique_ptr<FailoverController> f = Controller(client_.get(), "b");
  absl::StatusOr<int> promoted = f->Pass();
  ASSERT_TRUE(promoted.ok()) << promoted.status();
  EXPECT_EQ(*promoted, 1);
  cluster::DirectoryEntry e = Entry("s1");
  EXPECT_EQ(e.owner, "b");
  EXPECT_EQ(e.epoch, 2u);  // the old owner's commits are fenced off
  EXPECT_EQ(f->stats().promoted, 1);
  // A node that is not live is not even asked.
  for (const std::string& q : replicas_.asked()) {
    EXPECT_NE(q.substr(0, 2), "e:") << q;
  }
}

TEST_F(FailoverTest, AReplicaOfAnOlderEpochIsNotPromoted) {
  Live("b");
  // The session moved once (epoch 2); b's copy is of epoch 1.
  cluster::DirectoryEntry e = Session("s1", "old", {});
  absl::StatusOr<cluster::DirectoryEntry> moved =
      directory_->Move("acme", "s1", e, "gone");
  ASSERT_TRUE(moved.ok()) << moved.status();
  ASSERT_TRUE(directory_->SetReplicas("acme", "s1", *moved, {"b"}).ok());
  replicas_.Set("b", "gone", 1, 12);

  std::unique_ptr<FailoverController> f = Controller(client_.get(), "b");
  absl::StatusOr<int> promoted = f->Pass();
  ASSERT_TRUE(promoted.ok()) << promoted.status();
  EXPECT_EQ(*promoted, 0);
  EXPECT_EQ(Entry("s1").owner, "gone");
  EXPECT_EQ(f->stats().without_replica, 1);
}

TEST_F(FailoverTest, ASessionWhoseOwnerIsLiveStaysWhereItIs) {
  Live("a");
  Live("b");
  Session("s1", "a", {"b"});
  replicas_.Set("b", "a", 1, 20);  // even a fuller replica changes nothing
  std::unique_ptr<FailoverController> f = Controller(client_.get(), "b");
  absl::StatusOr<int> promoted = f->Pass();
  ASSERT_TRUE(promoted.ok()) << promoted.status();
  EXPECT_EQ(*promoted, 0);
  cluster::DirectoryEntry e = Entry("s1");
  EXPECT_EQ(e.owner, "a");
  EXPECT_EQ(e.epoch, 1u);
  EXPECT_TRUE(replicas_.asked().empty());
}

TEST_F(FailoverTest, WithoutALiveReplicaTheSessionWaitsForItsOwner) {
  Live("b");
  Session("s1", "gone", {"c"});  // c is not live
  Session("s2", "gone", {});     // never replicated
  std::unique_ptr<FailoverController> f = Controller(client_.get(), "b");
  absl::StatusOr<int> promoted = f->Pass();
  ASSERT_TRUE(promoted.ok()) << promoted.status();
  EXPECT_EQ(*promoted, 0);
  EXPECT_EQ(f->stats().without_replica, 2);
  EXPECT_EQ(Entry("s1").owner, "gone");
  EXPECT_EQ(Entry("s2").owner, "gone");

  // Its owner comes back: nothing to do, and nothing counted.
  Live("gone");
  promoted = f->Pass();
  ASSERT_TRUE(promoted.ok()) << promoted.status();
  EXPECT_EQ(*promoted, 0);
  EXPECT_EQ(f->stats().without_replica, 2);
}

TEST_F(FailoverTest, APromotedSessionIsNotPromotedAgain) {
  Live("b");
  Live("c");
  Session("s1", "gone", {"b", "c"});
  replicas_.Set("b", "gone", 1, 4);
  replicas_.Set("c", "gone", 1, 3);
  std::unique_ptr<FailoverController> f = Controller(client_.get(), "b");
  ASSERT_TRUE(f->Pass().ok());
  ASSERT_EQ(Entry("s1").owner, "b");
  // b is live: the next pass leaves the session alone.
  absl::StatusOr<int> promoted = f->Pass();
  ASSERT_TRUE(promoted.ok()) << promoted.status();
  EXPECT_EQ(*promoted, 0);
  EXPECT_EQ(Entry("s1").epoch, 2u);
  EXPECT_EQ(f->stats().promoted, 1);
}

}  // namespace
}  // namespace kvd::migration
