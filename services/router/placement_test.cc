#include "services/router/placement.h"

#include <map>

#include "gtest/gtest.h"

namespace kvd::router {
namespace {

cluster::NodeInfo Node(const std::string& id, const std::string& model,
                       int64_t running = 0) {
  cluster::NodeInfo n;
  n.id = id;
  n.model_id = model;
  n.model_fingerprint = "fp-" + model;
  n.http_url = "http://127.0.0.1:1";
  n.max_inflight = 4;
  n.max_queue = 4;
  n.load.running = running;
  return n;
}

TEST(PlacementTest, SpreadsNewSessionsEvenlyOverEqualNodes) {
  Placement p(/*seed=*/7);
  const std::vector<cluster::NodeInfo> nodes = {Node("a", "m"), Node("b", "m"),
                                                Node("c", "m")};
  std::map<std::string, int> count;
  for (int i = 0; i < 30; ++i) {
    absl::StatusOr<std::string> n = p.Pick(nodes, "m", {});
    ASSERT_TRUE(n.ok()) << n.status();
    p.Placed(*n);
    count[*n]++;
  }
  ASSERT_EQ(count.size(), 3u);
  for (const auto& [id, c] : count) EXPECT_LE(c, 11) << id;
}

TEST(PlacementTest, NeverPicksANodeOfAnotherModelOrADrainingOne) {
  Placement p(/*seed=*/1);
  const std::vector<cluster::NodeInfo> nodes = {
      Node("a", "m"), Node("b", "other"), Node("c", "m")};
  for (int i = 0; i < 50; ++i) {
    absl::StatusOr<std::string> n = p.Pick(nodes, "m", {"c"});
    ASSERT_TRUE(n.ok());
    EXPECT_EQ(*n, "a");
  }
  absl::StatusOr<std::string> none = p.Pick(nodes, "gemma", {});
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(none.status().message().find("m, other"), std::string::npos)
      << none.status();
  EXPECT_EQ(p.Pick(nodes, "m", {"a", "c"}).status().code(),
            absl::StatusCode::kUnavailable);
}

// A node that reports it cannot commit (a full disk) gets no new sessions,
// still gets stateless requests, and when no node can commit the error says
// why.
TEST(PlacementTest, NewSessionsAvoidANodeThatCannotCommit) {
  Placement p(/*seed=*/5);
  std::vector<cluster::NodeInfo> nodes = {Node("full", "m"), Node("ok", "m")};
  nodes[0].load.not_writable = "the disk holding /d has 1 MiB free";
  std::map<std::string, int> stateless;
  for (int i = 0; i < 40; ++i) {
    EXPECT_EQ(*p.Pick(nodes, "m", {}, /*commits=*/true), "ok");
    stateless[*p.Pick(nodes, "m", {}, /*commits=*/false)]++;
  }
  EXPECT_GT(stateless["full"], 0);
  const absl::Status none =
      p.Pick(nodes, "m", {"ok"}, /*commits=*/true).status();
  EXPECT_EQ(none.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(none.message().find("node 'full' reports: the disk holding /d"),
            std::string::npos)
      << none;
}

TEST(PlacementTest, PrefersTheLessLoadedOfTwo) {
  Placement p(/*seed=*/3);
  const std::vector<cluster::NodeInfo> nodes = {Node("busy", "m", 4),
                                                Node("idle", "m", 0)};
  for (int i = 0; i < 20; ++i) EXPECT_EQ(*p.Pick(nodes, "m", {}), "idle");
  // Its own in-flight requests count too.
  for (int i = 0; i < 8; ++i) p.Started("idle");
  EXPECT_EQ(*p.Pick(nodes, "m", {}), "busy");
}

}  // namespace
}  // namespace kvd::router
