// Where the router sends a request, against a real etcd: a session to its
// owner, a new one to a live node of its model that is not draining (by a
// directory transaction), a stateless request anywhere but where it failed;
// and the refusals a client sees (unknown, owner down, wrong model, over
// the tenant's limit), none of which leaves a directory entry behind.
#include "services/router/routing.h"

#include <memory>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "services/cluster/directory.h"
#include "services/cluster/membership.h"
#include "services/cluster/node_info.h"
#include "services/cluster/testing/etcd_test.h"

namespace kvd::router {
namespace {

class RoutingTest : public cluster::testing::EtcdTest {
 protected:
  void SetUp() override {
    EtcdTest::SetUp();
    if (HasFatalFailure()) return;
    directory_ = std::make_unique<cluster::SessionDirectory>(client_.get());
    auto routing = Routing::Connect(etcd_->endpoint());
    ASSERT_TRUE(routing.ok()) << routing.status();
    routing_ = std::move(*routing);
  }

  // A live node of `model`, as its membership publishes it.
  void Live(const std::string& id, const std::string& model) {
    cluster::NodeInfo info;
    info.id = id;
    info.http_url = absl::StrCat("http://", id, ":8080");
    info.grpc_address = absl::StrCat(id, ":9090");
    info.model_id = model;
    info.model_fingerprint = "sha256:" + model;
    info.max_inflight = 4;
    ASSERT_TRUE(client_
                    ->Put(absl::StrCat(cluster::kNodesPrefix, id),
                          cluster::EncodeNodeInfo(info))
                    .ok());
  }

  // Waits until the router's watches show `nodes` live and `drained`
  // draining (they follow etcd asynchronously).
  void AwaitView(const std::set<std::string>& nodes,
                 const std::set<std::string>& drained = {}) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    std::set<std::string> live;
    while (absl::Now() < deadline) {
      live.clear();
      for (const cluster::NodeInfo& n : routing_->LiveNodes()) {
        live.insert(n.id);
      }
      if (live == nodes && routing_->Drained() == drained) return;
      absl::SleepFor(absl::Milliseconds(20));
    }
    FAIL() << "the router's view never matched: " << live.size()
           << " live nodes";
  }

  std::unique_ptr<cluster::SessionDirectory> directory_;
  std::unique_ptr<Routing> routing_;
};

TEST_F(RoutingTest, ANewSessionIsPlacedOnALiveNodeOfItsModelThenFollowed) {
  Live("s1", "smollm2");
  Live("s2", "smollm2");
  Live("g1", "gemma3");
  ASSERT_TRUE(client_->Put(absl::StrCat(cluster::kDrainPrefix, "s2"), "").ok());
  AwaitView({"s1", "s2", "g1"}, {"s2"});

  absl::StatusOr<Target> placed = routing_->Place("acme", "c1", "smollm2");
  ASSERT_TRUE(placed.ok()) << placed.status();
  EXPECT_EQ(placed->route, "placed");
  EXPECT_EQ(placed->node.id, "s1") << "never another model's or a draining";
  auto e = directory_->Lookup("acme", "c1");
  ASSERT_TRUE(e.ok() && e->has_value());
  EXPECT_EQ((*e)->owner, "s1");
  EXPECT_EQ((*e)->epoch, 1u);

  // Placed once: every later call follows the directory.
  absl::StatusOr<Target> again = routing_->Place("acme", "c1", "smollm2");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->route, "owner");
  EXPECT_EQ(again->node.id, "s1");
  cluster::DirectoryEntry read;
  absl::StatusOr<Target> owner = routing_->Owner("acme", "c1", "", &read);
  ASSERT_TRUE(owner.ok()) << owner.status();
  EXPECT_EQ(owner->node.id, "s1");
  EXPECT_EQ(read.owner, "s1");
}

TEST_F(RoutingTest, ASessionGoesWhereverTheDirectorySaysNotWherePlacedFirst) {
  Live("s1", "smollm2");
  Live("s2", "smollm2");
  AwaitView({"s1", "s2"});
  absl::StatusOr<cluster::DirectoryEntry> e =
      directory_->Create("acme", "c1", "s1");
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_TRUE(directory_->Move("acme", "c1", *e, "s2").ok());  // migrated
  absl::StatusOr<Target> owner =
      routing_->Owner("acme", "c1", "smollm2", nullptr);
  ASSERT_TRUE(owner.ok()) << owner.status();
  EXPECT_EQ(owner->node.id, "s2");
}

TEST_F(RoutingTest, RefusalsSayWhyAndLeaveNoEntry) {
  Live("s1", "smollm2");
  Live("g1", "gemma3");
  AwaitView({"s1", "g1"});

  EXPECT_EQ(routing_->Owner("acme", "nope", "", nullptr).status().code(),
            absl::StatusCode::kNotFound);

  ASSERT_TRUE(directory_->Create("acme", "on-g1", "g1").ok());
  absl::Status wrong_model =
      routing_->Owner("acme", "on-g1", "smollm2", nullptr).status();
  EXPECT_EQ(wrong_model.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wrong_model.message().find("gemma3"), std::string::npos)
      << wrong_model;

  ASSERT_TRUE(directory_->Create("acme", "on-gone", "gone").ok());
  absl::Status down = routing_->Owner("acme", "on-gone", "", nullptr).status();
  EXPECT_EQ(down.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(down.message().find("gone"), std::string::npos) << down;

  // No node serves the model: nothing is placed.
  EXPECT_FALSE(routing_->Place("acme", "new-1", "qwen").ok());
  auto none = directory_->Lookup("acme", "new-1");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
}

TEST_F(RoutingTest, ATenantOverItsLimitOfNewSessionsPlacesNothing) {
  Live("s1", "smollm2");
  AwaitView({"s1"});
  routing_->LimitCreations(/*per_minute=*/1, /*burst=*/1);
  ASSERT_TRUE(routing_->Place("flood", "a", "smollm2").ok());
  absl::Status refused = routing_->Place("flood", "b", "smollm2").status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  auto b = directory_->Lookup("flood", "b");
  ASSERT_TRUE(b.ok());
  EXPECT_FALSE(b->has_value());
  // An existing session is no new one; another tenant has its own budget.
  EXPECT_TRUE(routing_->Place("flood", "a", "smollm2").ok());
  EXPECT_TRUE(routing_->Place("calm", "a", "smollm2").ok());
}

TEST_F(RoutingTest, AStatelessRequestSkipsTheNodesItFailedOn) {
  Live("s1", "smollm2");
  Live("s2", "smollm2");
  AwaitView({"s1", "s2"});
  absl::StatusOr<Target> t = routing_->Stateless("smollm2", {"s1"});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->node.id, "s2");
  EXPECT_EQ(t->route, "stateless");
  EXPECT_FALSE(routing_->Stateless("smollm2", {"s1", "s2"}).ok());
  // Nothing stateless touches the directory.
  auto listed = directory_->List("local");
  ASSERT_TRUE(listed.ok());
  EXPECT_TRUE(listed->empty());
}

}  // namespace
}  // namespace kvd::router
