// The drainer against a real etcd and real moves between engines (loopback
// data plane): where a drain sends each session, what it leaves alone, and
// rebalancing of an idle node's surplus. tests/cluster covers the same
// through `kvd cluster drain` on processes; these pin the choices.
#include "services/migration/drainer.h"

#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "ops/model/testing/model_cases.h"
#include "ops/model/testing/tiny_model.h"
#include "services/cluster/directory.h"
#include "services/cluster/membership.h"
#include "services/cluster/node_info.h"
#include "services/cluster/testing/etcd_process.h"
#include "services/engine/session_engine.h"
#include "services/engine/testing/engine_fixture.h"
#include "services/migration/inbound.h"
#include "services/migration/migrator.h"
#include "services/migration/testing/directory_fence_for_test.h"
#include "services/migration/testing/served_migration.h"
#include "services/transport/loopback_transport.h"

namespace kvd::migration {
namespace {

constexpr char kToken[] = "cluster-secret-for-test";

struct Node {
  std::string id;
  std::unique_ptr<storage::TieredStore> store;
  std::unique_ptr<engine::SessionEngine> engine;
  std::unique_ptr<testing::ServedMigration> migration;
  std::unique_ptr<Migrator> migrator;
};

class DrainerTest : public engine::testing::TinyModelTest {
 protected:
  void SetUp() override {
    ops::testing::TinyModelSpec spec;
    spec.n_layers = 2;
    LoadModel(spec);
    if (HasFatalFailure()) return;
    identity_ = engine::ModelIdentityOf(*model_, "sha256:tiny-drain");
    const char* tmp = std::getenv("TEST_TMPDIR");
    auto etcd = cluster::testing::EtcdProcess::Start(tmp ? tmp : "/tmp");
    ASSERT_TRUE(etcd.ok()) << etcd.status();
    etcd_ = std::move(*etcd);
    auto client = cluster::EtcdClient::Connect(
        {.endpoint = etcd_->endpoint(), .retry_for = absl::Seconds(1)});
    ASSERT_TRUE(client.ok()) << client.status();
    etcd_client_ = std::move(*client);
    directory_ =
        std::make_unique<cluster::SessionDirectory>(etcd_client_.get());
  }

  // A node serving the tiny model, registered live with `running` of 4
  // generation slots busy.
  Node* StartNode(const std::string& id, int64_t running = 0) {
    auto n = std::make_unique<Node>();
    n->id = id;
    auto store = engine::testing::OpenTestStore(
        engine::testing::FreshTestDir(absl::StrCat("node-", id)));
    EXPECT_TRUE(store.ok()) << store.status();
    n->store = std::move(*store);
    engine::SessionEngineOptions o;
    o.node_id = id;
    o.fence =
        std::make_shared<testing::DirectoryFenceForTest>(directory_.get(), id);
    o.chunk_tokens = 16;
    n->engine = std::make_unique<engine::SessionEngine>(*model_, identity_,
                                                        n->store.get(), o);
    n->migration = testing::ServeMigration(
        n->engine.get(), &plane_,
        InboundOptions{.idle_timeout = absl::Seconds(3),
                       .commit_wait = absl::Seconds(10)},
        kToken);
    PeerResolver resolve =
        [this](const std::string& peer) -> absl::StatusOr<PeerNode> {
      auto it = nodes_.find(peer);
      if (it == nodes_.end()) return absl::NotFoundError("no such node");
      return PeerNode{it->second->migration->address, identity_.fingerprint()};
    };
    n->migrator = std::make_unique<Migrator>(
        n->engine.get(), directory_.get(), &plane_, resolve,
        MigratorOptions{.node_id = id,
                        .cluster_token = kToken,
                        .rpc_timeout = absl::Seconds(30)});
    Register(id, n->migration->address, identity_.fingerprint(), running);
    Node* raw = n.get();
    nodes_[id] = raw;
    owned_.push_back(std::move(n));
    return raw;
  }

  // A live member's description, as its membership would publish it.
  void Register(const std::string& id, const std::string& address,
                const std::string& fingerprint, int64_t running) {
    cluster::NodeInfo info;
    info.id = id;
    info.grpc_address = address;
    info.model_id = "tiny";
    info.model_fingerprint = fingerprint;
    info.max_inflight = 4;
    info.load.running = running;
    ASSERT_TRUE(etcd_client_
                    ->Put(absl::StrCat(cluster::kNodesPrefix, id),
                          cluster::EncodeNodeInfo(info))
                    .ok());
  }

  void MarkDraining(const std::string& id) {
    ASSERT_TRUE(
        etcd_client_->Put(absl::StrCat(cluster::kDrainPrefix, id), "").ok());
  }

  // A session placed on `n` with one committed turn.
  void Converse(Node* n, const std::string& session) {
    absl::StatusOr<std::optional<cluster::DirectoryEntry>> e =
        directory_->Lookup("acme", session);
    ASSERT_TRUE(e.ok()) << e.status();
    if (!e->has_value()) {
      ASSERT_TRUE(directory_->Create("acme", session, n->id).ok());
    }
    engine::TurnRequest r;
    r.tenant = "acme";
    r.session = session;
    r.tokens = ops::testing::RandomTokens(12, 7, model_->config().vocab_size);
    r.create_if_missing = true;
    r.generate.max_tokens = 3;
    r.generate.ignore_eos = true;
    r.generate.sampling.temperature = 0;
    absl::StatusOr<engine::TurnResult> res =
        n->engine->RunTurn(r, *tokenizer_, nullptr);
    ASSERT_TRUE(res.ok()) << session << " on " << n->id << ": " << res.status();
  }

  std::string OwnerOf(const std::string& session) {
    absl::StatusOr<std::optional<cluster::DirectoryEntry>> e =
        directory_->Lookup("acme", session);
    EXPECT_TRUE(e.ok() && e->has_value());
    return e.ok() && e->has_value() ? (*e)->owner : "";
  }

  std::unique_ptr<Drainer> DrainerOf(Node* n, DrainerOptions o = {}) {
    o.node_id = n->id;
    o.model_fingerprint = identity_.fingerprint();
    return std::make_unique<Drainer>(etcd_client_.get(), directory_.get(),
                                     n->migrator.get(), o, n->engine.get());
  }

  v1::ModelIdentity identity_;
  transport::LoopbackTransport plane_;
  std::unique_ptr<cluster::testing::EtcdProcess> etcd_;
  std::unique_ptr<cluster::EtcdClient> etcd_client_;
  std::unique_ptr<cluster::SessionDirectory> directory_;
  std::map<std::string, Node*> nodes_;
  std::vector<std::unique_ptr<Node>> owned_;
};

TEST_P(DrainerTest, ADrainMovesEverySessionToTheLeastLoadedNodeThatMayTakeIt) {
  Node* a = StartNode("a");
  Node* busy = StartNode("busy", /*running=*/3);
  Node* idle = StartNode("idle", /*running=*/0);
  // Neither of these may take a session, though both are idle: one serves
  // another model, the other drains too. (Their addresses lead nowhere: a
  // move there would fail and be counted.)
  Register("other-model", "127.0.0.1:1", "sha256:another-model", 0);
  Register("also-draining", "127.0.0.1:1", identity_.fingerprint(), 0);
  MarkDraining("also-draining");
  for (int i = 0; i < 3; ++i) Converse(a, absl::StrCat("s", i));
  MarkDraining("a");

  std::unique_ptr<Drainer> d = DrainerOf(a);
  absl::StatusOr<int> moved = d->Pass();
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(*moved, 3);
  EXPECT_TRUE(d->stats().draining);
  EXPECT_EQ(d->stats().moved, 3);
  EXPECT_EQ(d->stats().failed, 0);
  // busy reports 3 of 4 slots in use; idle stays the less loaded even with
  // what this drain sent it.
  for (int i = 0; i < 3; ++i) {
    const std::string s = absl::StrCat("s", i);
    EXPECT_EQ(OwnerOf(s), "idle") << s;
    EXPECT_EQ(a->engine->GetSession("acme", s).status().code(),
              absl::StatusCode::kNotFound)
        << s << " left on the drained node";
    Converse(idle, s);  // and goes on there
  }
  absl::StatusOr<storage::SessionListPage> on_busy =
      busy->engine->ListSessions("acme", "", 100);
  ASSERT_TRUE(on_busy.ok()) << on_busy.status();
  EXPECT_TRUE(on_busy->sessions.empty());

  // Nothing left: the next pass moves nothing.
  moved = d->Pass();
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(*moved, 0);
}

TEST_P(DrainerTest, ADrainSpreadsOverEquallyLoadedNodes) {
  Node* a = StartNode("a");
  StartNode("b");
  StartNode("c");
  for (int i = 0; i < 4; ++i) Converse(a, absl::StrCat("s", i));
  MarkDraining("a");
  std::unique_ptr<Drainer> d = DrainerOf(a);
  absl::StatusOr<int> moved = d->Pass();
  ASSERT_TRUE(moved.ok()) << moved.status();
  ASSERT_EQ(*moved, 4);
  std::map<std::string, int> per_node;
  for (int i = 0; i < 4; ++i) per_node[OwnerOf(absl::StrCat("s", i))]++;
  EXPECT_EQ(per_node["b"], 2);
  EXPECT_EQ(per_node["c"], 2);
}

TEST_P(DrainerTest, WithNowhereToGoSessionsStayAndServe) {
  Node* a = StartNode("a");
  Register("other-model", "127.0.0.1:1", "sha256:another-model", 0);
  Converse(a, "s0");
  MarkDraining("a");
  std::unique_ptr<Drainer> d = DrainerOf(a);
  absl::StatusOr<int> moved = d->Pass();
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(*moved, 0);
  EXPECT_EQ(d->stats().failed, 0);
  EXPECT_EQ(OwnerOf("s0"), "a");
  Converse(a, "s0");
}

TEST_P(DrainerTest, ANodeNotDrainingMovesNothingUntilItOwnsTooMany) {
  Node* a = StartNode("a");
  Node* b = StartNode("b");
  Node* c = StartNode("c");
  for (int i = 0; i < 2; ++i) Converse(a, absl::StrCat("s", i));
  Converse(b, "on-b");
  Converse(c, "on-c");
  // a owns 2, b and c 1 each. Too many is more than 1.5x the mean and at
  // least 2 more than the least loaded: 2 is not above 1.5 x 4/3 = 2.
  std::unique_ptr<Drainer> d =
      DrainerOf(a, {.rebalance_every = absl::Hours(1)});
  absl::StatusOr<int> moved = d->Pass();
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(*moved, 0);
  EXPECT_FALSE(d->stats().draining);
  for (int i = 0; i < 2; ++i) EXPECT_EQ(OwnerOf(absl::StrCat("s", i)), "a");

  // Below the mean, c's rebalancer never takes sessions.
  std::unique_ptr<Drainer> from_c =
      DrainerOf(c, {.rebalance_every = absl::Hours(1)});
  moved = from_c->Pass();
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(*moved, 0);

  // Two more on a: 4 of 6 is above 1.5 x 2 = 3, and 3 more than b or c: a
  // hands one of them over.
  Converse(a, "s2");
  Converse(a, "s3");
  d = DrainerOf(a, {.rebalance_every = absl::Hours(1)});
  moved = d->Pass();
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(*moved, 1);
  int on_a = 0;
  for (int i = 0; i < 4; ++i) on_a += OwnerOf(absl::StrCat("s", i)) == "a";
  EXPECT_EQ(on_a, 3);
  EXPECT_EQ(OwnerOf("on-b"), "b");
  EXPECT_EQ(OwnerOf("on-c"), "c");
}

TEST_P(DrainerTest, RebalancingMovesOneIdleSessionPerPeriod) {
  Node* a = StartNode("a");
  StartNode("b");
  for (int i = 0; i < 4; ++i) Converse(a, absl::StrCat("s", i));
  // 4 against 0: above 1.5x the mean of 2, and 4 more than b.
  std::unique_ptr<Drainer> d =
      DrainerOf(a, {.rebalance_every = absl::Hours(1)});
  absl::StatusOr<int> moved = d->Pass();
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(*moved, 1);
  EXPECT_EQ(d->stats().rebalanced, 1);
  int on_b = 0;
  for (int i = 0; i < 4; ++i) on_b += OwnerOf(absl::StrCat("s", i)) == "b";
  EXPECT_EQ(on_b, 1);
  // Within the period: nothing more.
  moved = d->Pass();
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(*moved, 0);
  EXPECT_EQ(d->stats().rebalanced, 1);
}

TEST_P(DrainerTest, RebalancingIsOffWithAZeroPeriod) {
  Node* a = StartNode("a");
  StartNode("b");
  for (int i = 0; i < 4; ++i) Converse(a, absl::StrCat("s", i));
  std::unique_ptr<Drainer> d =
      DrainerOf(a, {.rebalance_every = absl::ZeroDuration()});
  absl::StatusOr<int> moved = d->Pass();
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(*moved, 0);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(OwnerOf(absl::StrCat("s", i)), "a");
}

// Draining moves sessions; one model family is enough.
std::vector<ops::testing::FamilyCase> Cases() {
  std::vector<ops::testing::FamilyCase> out;
  for (const auto& c : ops::testing::AllFamilyCases()) {
    if (c.family == "llama" && c.precision == ops::Precision::kF32) {
      out.push_back(c);
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Families, DrainerTest, ::testing::ValuesIn(Cases()),
                         ops::testing::FamilyCaseName);

}  // namespace
}  // namespace kvd::migration
