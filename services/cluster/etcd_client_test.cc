// The etcd client against a real etcd (Debian's etcd-server) on loopback.
#include "services/cluster/etcd_client.h"

#include <memory>
#include <string>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/cluster/testing/etcd_test.h"

namespace kvd::cluster {
namespace {

using ::testing::HasSubstr;

using EtcdClientTest = testing::EtcdTest;

TEST_F(EtcdClientTest, PutGetPrefixDelete) {
  ASSERT_TRUE(client_->Put("/kvd/v1/nodes/a", "A").ok());
  ASSERT_TRUE(client_->Put("/kvd/v1/nodes/b", "B").ok());
  ASSERT_TRUE(client_->Put("/kvd/v1/other", "X").ok());
  absl::StatusOr<std::optional<EtcdKeyValue>> a =
      client_->Get("/kvd/v1/nodes/a");
  ASSERT_TRUE(a.ok() && a->has_value()) << a.status();
  EXPECT_EQ((*a)->value, "A");
  EXPECT_GT((*a)->mod_revision, 0);
  absl::StatusOr<std::vector<EtcdKeyValue>> nodes =
      client_->GetPrefix("/kvd/v1/nodes/");
  ASSERT_TRUE(nodes.ok()) << nodes.status();
  ASSERT_EQ(nodes->size(), 2u);
  EXPECT_EQ((*nodes)[0].key, "/kvd/v1/nodes/a");
  EXPECT_EQ((*nodes)[1].key, "/kvd/v1/nodes/b");
  ASSERT_TRUE(client_->Delete("/kvd/v1/nodes/a").ok());
  absl::StatusOr<std::optional<EtcdKeyValue>> gone =
      client_->Get("/kvd/v1/nodes/a");
  ASSERT_TRUE(gone.ok());
  EXPECT_FALSE(gone->has_value());
}

// The directory's ownership moves: a write only if the key is still at the
// revision the writer read; a racer that read the same revision loses.
TEST_F(EtcdClientTest, PutIfModRevisionLetsOneRacerWin) {
  const std::string key = "/kvd/v1/sessions/acme/chat-1";
  absl::StatusOr<bool> created = client_->PutIfModRevision(key, "owner=a", 0);
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_TRUE(*created);
  absl::StatusOr<bool> again = client_->PutIfModRevision(key, "owner=b", 0);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(*again);  // it exists already
  absl::StatusOr<std::optional<EtcdKeyValue>> read = client_->Get(key);
  ASSERT_TRUE(read.ok() && read->has_value());
  const int64_t rev = (*read)->mod_revision;
  absl::StatusOr<bool> first = client_->PutIfModRevision(key, "owner=b", rev);
  absl::StatusOr<bool> second = client_->PutIfModRevision(key, "owner=c", rev);
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_TRUE(*first);
  EXPECT_FALSE(*second);
  EXPECT_EQ((*client_->Get(key))->value, "owner=b");
}

// Keys under a lease live while it is kept alive and vanish with it.
TEST_F(EtcdClientTest, LeasedKeysVanishWithTheirLease) {
  absl::StatusOr<int64_t> lease = client_->GrantLease(absl::Seconds(2));
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_TRUE(client_->Put("/kvd/v1/nodes/n1", "up", *lease).ok());
  absl::StatusOr<absl::Duration> ttl = client_->KeepAliveOnce(*lease);
  ASSERT_TRUE(ttl.ok()) << ttl.status();
  EXPECT_GT(*ttl, absl::ZeroDuration());
  EXPECT_EQ((*client_->Get("/kvd/v1/nodes/n1"))->lease, *lease);
  ASSERT_TRUE(client_->RevokeLease(*lease).ok());
  EXPECT_FALSE(client_->Get("/kvd/v1/nodes/n1")->has_value());
  const absl::StatusOr<absl::Duration> lost = client_->KeepAliveOnce(*lease);
  EXPECT_EQ(lost.status().code(), absl::StatusCode::kNotFound) << lost.status();
  EXPECT_THAT(lost.status().message(), HasSubstr("expired"));

  // Not kept alive: it expires by itself.
  absl::StatusOr<int64_t> short_lease = client_->GrantLease(absl::Seconds(1));
  ASSERT_TRUE(short_lease.ok());
  ASSERT_TRUE(client_->Put("/kvd/v1/nodes/n2", "up", *short_lease).ok());
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (client_->Get("/kvd/v1/nodes/n2")->has_value() &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_FALSE(client_->Get("/kvd/v1/nodes/n2")->has_value());
}

// A list of members: calls go to those that answer, so a member that is
// down (here: nothing listens at 127.0.0.1:1) costs nothing but its share of
// failed connection attempts, which the client skips.
TEST_F(EtcdClientTest, AListOfMembersSkipsOneThatIsDown) {
  absl::StatusOr<std::unique_ptr<EtcdClient>> listed = EtcdClient::Connect(
      {.endpoint = "127.0.0.1:1, http://" + etcd_->endpoint() + "/"});
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ((*listed)->endpoint(), "127.0.0.1:1," + etcd_->endpoint());
  for (int i = 0; i < 10; ++i) {
    const std::string key = "/kvd/v1/k" + std::to_string(i);
    ASSERT_TRUE((*listed)->Put(key, "v").ok()) << i;
    absl::StatusOr<std::optional<EtcdKeyValue>> got = client_->Get(key);
    ASSERT_TRUE(got.ok() && got->has_value()) << i;
  }
}

TEST(EtcdClientConnectTest, AListNamesMembersByAddress) {
  absl::StatusOr<std::unique_ptr<EtcdClient>> c =
      EtcdClient::Connect({.endpoint = "10.0.0.1:2379,etcd-2:2379"});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("'etcd-2:2379'"));
}

TEST(EtcdClientConnectTest, NoEtcdThereIsUnavailableNamingTheEndpoint) {
  absl::StatusOr<std::unique_ptr<EtcdClient>> c = EtcdClient::Connect(
      {.endpoint = "127.0.0.1:1", .timeout = absl::Milliseconds(300)});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(c.status().message(), HasSubstr("127.0.0.1:1"));
}

}  // namespace
}  // namespace kvd::cluster
