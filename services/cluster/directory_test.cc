// The session directory against a real etcd: placing a session once, moves
// that raise the epoch, and races where exactly one writer wins.
#include "services/cluster/directory.h"

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/cluster/testing/etcd_test.h"

namespace kvd::cluster {
namespace {

using DirectoryTest = testing::EtcdTest;

TEST_F(DirectoryTest, CreateOnceThenMovesRaiseTheEpoch) {
  SessionDirectory dir(client_.get());
  EXPECT_FALSE(dir.Lookup("acme", "c1")->has_value());
  absl::StatusOr<DirectoryEntry> e = dir.Create("acme", "c1", "n1");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->owner, "n1");
  EXPECT_EQ(e->epoch, 1u);
  EXPECT_EQ(dir.Create("acme", "c1", "n2").status().code(),
            absl::StatusCode::kAlreadyExists);

  absl::StatusOr<DirectoryEntry> moved = dir.Move("acme", "c1", *e, "n2");
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(moved->owner, "n2");
  EXPECT_EQ(moved->epoch, 2u);
  // A move from the entry as it was before is stale.
  const absl::Status stale = dir.Move("acme", "c1", *e, "n3").status();
  EXPECT_EQ(stale.code(), absl::StatusCode::kAborted) << stale;
  EXPECT_EQ((*dir.Lookup("acme", "c1"))->owner, "n2");
}

TEST_F(DirectoryTest, OfRacingMovesExactlyOneWins) {
  SessionDirectory dir(client_.get());
  absl::StatusOr<DirectoryEntry> e = dir.Create("acme", "c2", "n1");
  ASSERT_TRUE(e.ok()) << e.status();
  std::atomic<int> won{0}, lost{0};
  std::vector<std::thread> racers;
  for (int i = 0; i < 4; ++i) {
    racers.emplace_back([&, i] {
      absl::StatusOr<DirectoryEntry> m =
          dir.Move("acme", "c2", *e, absl::StrCat("n", 10 + i));
      (m.ok() ? won : lost)++;
    });
  }
  for (std::thread& t : racers) t.join();
  EXPECT_EQ(won.load(), 1);
  EXPECT_EQ(lost.load(), 3);
  EXPECT_EQ((*dir.Lookup("acme", "c2"))->epoch, 2u);
}

TEST_F(DirectoryTest, ADamagedEntryIsDataLoss) {
  ASSERT_TRUE(client_->Put(SessionDirectory::Key("acme", "bad"), "{nope").ok());
  SessionDirectory dir(client_.get());
  EXPECT_EQ(dir.Lookup("acme", "bad").status().code(),
            absl::StatusCode::kDataLoss);
}

TEST_F(DirectoryTest, ListsATenantsSessionsAndRemovesOnlyTheEntryItRead) {
  SessionDirectory dir(client_.get());
  absl::StatusOr<DirectoryEntry> a = dir.Create("acme", "a", "n1");
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(dir.Create("acme", "b", "n2").ok());
  ASSERT_TRUE(dir.Create("acmex", "c", "n1").ok());  // another tenant
  auto listed = dir.List("acme");
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 2u);
  EXPECT_EQ((*listed)[0].first, "a");
  EXPECT_EQ((*listed)[1].second.owner, "n2");

  absl::StatusOr<DirectoryEntry> moved = dir.Move("acme", "a", *a, "n3");
  ASSERT_TRUE(moved.ok());
  EXPECT_EQ(dir.Remove("acme", "a", *a).code(), absl::StatusCode::kAborted);
  ASSERT_TRUE(dir.Remove("acme", "a", *moved).ok());
  EXPECT_FALSE(dir.Lookup("acme", "a")->has_value());
}

TEST_F(DirectoryTest, ListsWhatANodeOwnsAcrossTenants) {
  SessionDirectory dir(client_.get());
  ASSERT_TRUE(dir.Create("acme", "a", "n1").ok());
  ASSERT_TRUE(dir.Create("acme", "b", "n2").ok());
  ASSERT_TRUE(dir.Create("zeta", "c.1", "n1").ok());
  auto owned = dir.ListOwnedBy("n1");
  ASSERT_TRUE(owned.ok()) << owned.status();
  ASSERT_EQ(owned->size(), 2u);
  EXPECT_EQ((*owned)[0].tenant, "acme");
  EXPECT_EQ((*owned)[0].session, "a");
  EXPECT_EQ((*owned)[1].tenant, "zeta");
  EXPECT_EQ((*owned)[1].session, "c.1");
  EXPECT_EQ((*owned)[1].entry.epoch, 1u);
  EXPECT_TRUE(dir.ListOwnedBy("n9")->empty());
}

TEST_F(DirectoryTest, ReplicasAreSetByTransactionAndClearedByAMove) {
  SessionDirectory dir(client_.get());
  absl::StatusOr<DirectoryEntry> e = dir.Create("acme", "r", "n1");
  ASSERT_TRUE(e.ok());
  absl::StatusOr<DirectoryEntry> with =
      dir.SetReplicas("acme", "r", *e, {"n2"});
  ASSERT_TRUE(with.ok()) << with.status();
  EXPECT_EQ(with->replicas, std::vector<std::string>{"n2"});
  EXPECT_EQ(with->epoch, 1u);
  // A writer that read the entry before is refused.
  EXPECT_EQ(dir.SetReplicas("acme", "r", *e, {"n3"}).status().code(),
            absl::StatusCode::kAborted);
  absl::StatusOr<DirectoryEntry> moved = dir.Move("acme", "r", *with, "n2");
  ASSERT_TRUE(moved.ok());
  EXPECT_TRUE(moved->replicas.empty());
  EXPECT_EQ(moved->epoch, 2u);
}

}  // namespace
}  // namespace kvd::cluster
