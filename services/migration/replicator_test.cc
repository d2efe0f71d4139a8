// Synchronous replication between two engines over a real etcd directory, a
// real gRPC control channel and the loopback data plane: what the owner may
// acknowledge, and the replica set it leaves for a failover to promote from.
// The fault harness (tests/cluster/nemesis.py) found a turn acknowledged
// while its replica lacked it; these pin the rules that prevent it.
#include "services/migration/replicator.h"

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
#include "services/migration/outbound.h"
#include "services/migration/testing/directory_fence_for_test.h"
#include "services/migration/testing/served_migration.h"
#include "services/transport/loopback_transport.h"
#include "storage/checkpoint/ownership.h"

namespace kvd::migration {
namespace {

constexpr char kToken[] = "cluster-secret-for-test";

struct Node {
  std::string id;
  std::unique_ptr<storage::TieredStore> store;
  std::unique_ptr<engine::SessionEngine> engine;
  std::unique_ptr<testing::ServedMigration> migration;
  std::unique_ptr<Replicator> replicator;  // set on the owner
};

class ReplicatorTest : public engine::testing::TinyModelTest {
 protected:
  void SetUp() override {
    ops::testing::TinyModelSpec spec;
    spec.n_layers = 2;
    LoadModel(spec);
    if (HasFatalFailure()) return;
    identity_ = engine::ModelIdentityOf(*model_, "sha256:tiny-replication");
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
    owner_ = StartNode("a");
    replica_ = StartNode("b");
    // b is a live node of the model: the replicator's only candidate.
    RegisterLive(*replica_);
    ASSERT_TRUE(directory_->Create("acme", "chat-1", "a").ok());
    StartReplicator();
  }

  std::unique_ptr<Node> StartNode(const std::string& id) {
    auto n = std::make_unique<Node>();
    n->id = id;
    auto store = engine::testing::OpenTestStore(
        engine::testing::FreshTestDir(absl::StrCat("replicator-", id)));
    EXPECT_TRUE(store.ok()) << store.status();
    n->store = std::move(*store);
    engine::SessionEngineOptions o;
    o.node_id = id;
    o.fence =
        std::make_shared<testing::DirectoryFenceForTest>(directory_.get(), id);
    o.chunk_tokens = 16;
    Node* self = n.get();
    o.on_commit = [self](const storage::TurnUpdate& u) {
      return self->replicator ? self->replicator->OnCommit(u)
                              : absl::OkStatus();
    };
    o.before_turn = [self](const v1::SessionManifest& m) {
      return self->replicator ? self->replicator->Settle(m) : absl::OkStatus();
    };
    n->engine = std::make_unique<engine::SessionEngine>(*model_, identity_,
                                                        n->store.get(), o);
    n->migration = testing::ServeMigration(
        n->engine.get(), &plane_,
        InboundOptions{.idle_timeout = absl::Seconds(3),
                       .commit_wait = absl::Seconds(10)},
        kToken);
    return n;
  }

  // The owner's replicator, new: what a restarted owner has.
  void StartReplicator() {
    owner_->replicator.reset();
    PeerResolver resolve =
        [this](const std::string& id) -> absl::StatusOr<PeerNode> {
      if (id != "b" || replica_unreachable_) {
        return absl::UnavailableError(absl::StrCat("node '", id, "' is cut"));
      }
      return PeerNode{replica_->migration->address, identity_.fingerprint()};
    };
    owner_->replicator = ReplicatorOf(owner_.get(), resolve);
  }

  // A replicator of `n` (R = 2, sync) that finds its peers by `resolve`.
  // Refill passes run when a test calls RefillPass.
  std::unique_ptr<Replicator> ReplicatorOf(Node* n, PeerResolver resolve) {
    return std::make_unique<Replicator>(
        n->engine.get(), etcd_client_.get(), directory_.get(), &plane_,
        std::move(resolve),
        ReplicatorOptions{.node_id = n->id,
                          .model_fingerprint = identity_.fingerprint(),
                          .replicas = 2,
                          .sync = true,
                          .peer = {.cluster_token = kToken,
                                   .piece_bytes = 4096,
                                   .rpc_timeout = absl::Seconds(30)},
                          .refill_every = absl::ZeroDuration()});
  }

  // `n` as a live member of the model, as its membership publishes it.
  void RegisterLive(const Node& n) {
    cluster::NodeInfo info;
    info.id = n.id;
    info.grpc_address = n.migration->address;
    info.model_id = "tiny";
    info.model_fingerprint = identity_.fingerprint();
    info.max_inflight = 4;
    ASSERT_TRUE(etcd_client_
                    ->Put(absl::StrCat(cluster::kNodesPrefix, n.id),
                          cluster::EncodeNodeInfo(info))
                    .ok());
  }

  // A resolver that finds no peer.
  static PeerResolver NoPeers() {
    return [](const std::string& id) -> absl::StatusOr<PeerNode> {
      return absl::UnavailableError(absl::StrCat("no node '", id, "' here"));
    };
  }

  absl::Status Turn(int turn) {
    engine::TurnRequest r;
    r.tenant = "acme";
    r.session = "chat-1";
    r.tokens = ops::testing::RandomTokens(9 + 7 * turn, 100 + turn,
                                          model_->config().vocab_size);
    r.request_id = absl::StrCat("turn-", turn);
    r.create_if_missing = true;
    r.generate.max_tokens = 5;
    r.generate.ignore_eos = true;
    r.generate.sampling.temperature = 0;
    return owner_->engine->RunTurn(r, *tokenizer_, nullptr).status();
  }

  std::vector<std::string> Replicas() {
    auto e = directory_->Lookup("acme", "chat-1");
    EXPECT_TRUE(e.ok() && e->has_value());
    return e.ok() && e->has_value() ? (*e)->replicas
                                    : std::vector<std::string>{};
  }

  int64_t ReplicaTurns() {
    auto m = replica_->store->GetManifest("acme", "chat-1");
    return m.ok() ? m->turn_ends_size() : -1;
  }

  v1::SessionManifest OwnerCopy() {
    return *owner_->store->GetManifest("acme", "chat-1");
  }

  transport::LoopbackTransport plane_;
  v1::ModelIdentity identity_;
  std::unique_ptr<cluster::testing::EtcdProcess> etcd_;
  std::unique_ptr<cluster::EtcdClient> etcd_client_;
  std::unique_ptr<cluster::SessionDirectory> directory_;
  std::unique_ptr<Node> owner_, replica_;
  bool replica_unreachable_ = false;
};

// Every turn acknowledged is on every listed replica; a replica that misses
// one leaves the set before the turn is acknowledged.
TEST_P(ReplicatorTest, AnAcknowledgedTurnIsOnEveryListedReplica) {
  ASSERT_TRUE(Turn(0).ok());
  EXPECT_EQ(Replicas(), std::vector<std::string>{"b"});
  EXPECT_EQ(ReplicaTurns(), 1);
  ASSERT_TRUE(Turn(1).ok());
  EXPECT_EQ(ReplicaTurns(), 2);

  replica_unreachable_ = true;
  ASSERT_TRUE(Turn(2).ok());  // b left the set first
  EXPECT_TRUE(Replicas().empty());
  EXPECT_EQ(ReplicaTurns(), 2);

  replica_unreachable_ = false;
  ASSERT_TRUE(Turn(3).ok());  // b back, by a whole copy
  EXPECT_EQ(Replicas(), std::vector<std::string>{"b"});
  EXPECT_EQ(ReplicaTurns(), 4);
}

// A replica listed while it lacks a committed turn (its removal lost: etcd
// failed at the wrong moment, then the owner restarted) is found and removed
// before the next turn runs; one that holds everything stays.
TEST_P(ReplicatorTest, SettleRemovesAListedReplicaThatLacksATurn) {
  ASSERT_TRUE(Turn(0).ok());
  StartReplicator();  // a restart: nothing is known settled
  ASSERT_TRUE(owner_->replicator->Settle(OwnerCopy()).ok());
  EXPECT_EQ(Replicas(), std::vector<std::string>{"b"});  // b is current

  replica_unreachable_ = true;
  ASSERT_TRUE(Turn(1).ok());
  ASSERT_TRUE(Replicas().empty());
  auto e = directory_->Lookup("acme", "chat-1");
  ASSERT_TRUE(e.ok() && e->has_value());
  ASSERT_TRUE(directory_->SetReplicas("acme", "chat-1", **e, {"b"}).ok());
  replica_unreachable_ = false;
  StartReplicator();
  EXPECT_EQ(ReplicaTurns(), 1);
  ASSERT_TRUE(owner_->replicator->Settle(OwnerCopy()).ok());
  EXPECT_TRUE(Replicas().empty()) << "b lacks turn 1 and must not be listed";
}

// A session whose replica set is short while nobody talks to it (a move or
// a failover cleared it, a replica failed) gets a whole copy on a live node
// between turns, and later turns reach that replica as usual.
TEST_P(ReplicatorTest, AnIdleSessionWithoutReplicasIsRefilled) {
  ASSERT_TRUE(Turn(0).ok());
  ASSERT_EQ(Replicas(), std::vector<std::string>{"b"});
  // As a move leaves it: no replicas listed, and b's copy gone.
  auto e = directory_->Lookup("acme", "chat-1");
  ASSERT_TRUE(e.ok() && e->has_value());
  ASSERT_TRUE(directory_->SetReplicas("acme", "chat-1", **e, {}).ok());
  ASSERT_TRUE(replica_->engine->DropReplica("acme", "chat-1").ok());
  ASSERT_EQ(ReplicaTurns(), -1);

  replica_unreachable_ = true;  // nowhere to copy to: it waits
  absl::StatusOr<int> refilled = owner_->replicator->RefillPass();
  ASSERT_TRUE(refilled.ok()) << refilled.status();
  EXPECT_EQ(*refilled, 0);
  EXPECT_TRUE(Replicas().empty());

  replica_unreachable_ = false;
  refilled = owner_->replicator->RefillPass();
  ASSERT_TRUE(refilled.ok()) << refilled.status();
  EXPECT_EQ(*refilled, 1);
  EXPECT_EQ(Replicas(), std::vector<std::string>{"b"});
  EXPECT_EQ(ReplicaTurns(), 1);
  EXPECT_EQ(owner_->replicator->stats().sets_refilled, 1);

  refilled = owner_->replicator->RefillPass();  // full: nothing to do
  ASSERT_TRUE(refilled.ok()) << refilled.status();
  EXPECT_EQ(*refilled, 0);

  ASSERT_TRUE(Turn(1).ok());
  EXPECT_EQ(ReplicaTurns(), 2);
  EXPECT_EQ(Replicas(), std::vector<std::string>{"b"});
}

// After a failover gave the session to its replica b (the directory moved
// it, epoch 2, no replicas), b's refill takes it up (its copy becomes the
// primary: served, listed) and gives the old owner a copy as its replica.
TEST_P(ReplicatorTest, AFailedOverSessionIsTakenUpAndReplicatedAgain) {
  ASSERT_TRUE(Turn(0).ok());
  ASSERT_TRUE(Turn(1).ok());
  auto e = directory_->Lookup("acme", "chat-1");
  ASSERT_TRUE(e.ok() && e->has_value());
  ASSERT_TRUE(directory_->Move("acme", "chat-1", **e, "b").ok());
  EXPECT_EQ(replica_->engine->GetSession("acme", "chat-1").status().code(),
            absl::StatusCode::kNotFound)
      << "a replica copy is not a live session before it is taken up";

  RegisterLive(*owner_);
  PeerResolver resolve =
      [this](const std::string& id) -> absl::StatusOr<PeerNode> {
    if (id != "a") return absl::UnavailableError("no such node");
    return PeerNode{owner_->migration->address, identity_.fingerprint()};
  };
  std::unique_ptr<Replicator> on_b = ReplicatorOf(replica_.get(), resolve);
  absl::StatusOr<int> refilled = on_b->RefillPass();
  ASSERT_TRUE(refilled.ok()) << refilled.status();
  EXPECT_EQ(*refilled, 1);
  EXPECT_EQ(Replicas(), std::vector<std::string>{"a"});
  absl::StatusOr<v1::SessionManifest> primary =
      replica_->engine->GetSession("acme", "chat-1");
  ASSERT_TRUE(primary.ok()) << primary.status();
  EXPECT_EQ(primary->turn_ends_size(), 2);
  EXPECT_EQ(storage::EpochOf(*primary), 2u);
  absl::StatusOr<v1::SessionManifest> copy =
      owner_->engine->GetReplica("acme", "chat-1");
  ASSERT_TRUE(copy.ok()) << copy.status();
  EXPECT_EQ(copy->turn_ends_size(), 2);
  EXPECT_EQ(storage::EpochOf(*copy), 2u);
  EXPECT_EQ(copy->owner_node(), "b");
}

// An owner restarted on an empty data directory holds no copy of a session
// the directory still gives it. Its refill pass hands the session to the
// replica holding it (epoch + 1), whose own pass takes it up: the
// conversation goes on with every acknowledged turn, never anew.
TEST_P(ReplicatorTest, AnOwnerThatLostItsDiskHandsItsSessionsToAReplica) {
  ASSERT_TRUE(Turn(0).ok());
  ASSERT_TRUE(Turn(1).ok());
  ASSERT_EQ(Replicas(), std::vector<std::string>{"b"});
  ASSERT_EQ(ReplicaTurns(), 2);
  owner_->replicator.reset();
  owner_ = StartNode("a");  // the same node, on a new and empty disk
  StartReplicator();
  absl::StatusOr<int> refilled = owner_->replicator->RefillPass();
  ASSERT_TRUE(refilled.ok()) << refilled.status();
  EXPECT_EQ(owner_->replicator->stats().handed_over, 1);
  auto e = directory_->Lookup("acme", "chat-1");
  ASSERT_TRUE(e.ok() && e->has_value());
  EXPECT_EQ((*e)->owner, "b");
  EXPECT_EQ((*e)->epoch, 2u);

  // Later passes look no more (every session was found or handed over).
  refilled = owner_->replicator->RefillPass();
  ASSERT_TRUE(refilled.ok()) << refilled.status();
  EXPECT_EQ(owner_->replicator->stats().handed_over, 1);

  std::unique_ptr<Replicator> on_b = ReplicatorOf(replica_.get(), NoPeers());
  ASSERT_TRUE(on_b->RefillPass().ok());
  absl::StatusOr<v1::SessionManifest> primary =
      replica_->engine->GetSession("acme", "chat-1");
  ASSERT_TRUE(primary.ok()) << primary.status();
  EXPECT_EQ(primary->turn_ends_size(), 2);
  EXPECT_EQ(storage::EpochOf(*primary), 2u);
}

// A replica restarted on an empty data directory is still listed in the
// set while it holds nothing; its first refill pass takes it out, and the
// owner's next pass gives it (or another node) a whole copy again.
TEST_P(ReplicatorTest, AReplicaThatLostItsDiskLeavesTheSetAndIsRefilled) {
  ASSERT_TRUE(Turn(0).ok());
  ASSERT_EQ(Replicas(), std::vector<std::string>{"b"});
  replica_ = StartNode("b");  // the same node, on a new and empty disk
  ASSERT_EQ(ReplicaTurns(), -1);
  std::unique_ptr<Replicator> on_b = ReplicatorOf(replica_.get(), NoPeers());
  ASSERT_TRUE(on_b->RefillPass().ok());
  EXPECT_TRUE(Replicas().empty()) << "b holds nothing and must not be listed";

  absl::StatusOr<int> refilled = owner_->replicator->RefillPass();
  ASSERT_TRUE(refilled.ok()) << refilled.status();
  EXPECT_EQ(*refilled, 1);
  EXPECT_EQ(Replicas(), std::vector<std::string>{"b"});
  EXPECT_EQ(ReplicaTurns(), 1);
}

// With the directory unreachable after the commit, nothing says the
// replicas hold the turn: OnCommit fails, so the turn is not acknowledged;
// and Settle refuses to let a turn run.
TEST_P(ReplicatorTest, NoDirectoryNoAcknowledgement) {
  ASSERT_TRUE(Turn(0).ok());
  const v1::SessionManifest committed = OwnerCopy();
  StartReplicator();
  etcd_.reset();  // etcd stops
  storage::TurnUpdate update;
  update.manifest = committed;
  const absl::Status replicated = owner_->replicator->OnCommit(update);
  EXPECT_EQ(replicated.code(), absl::StatusCode::kUnavailable) << replicated;
  const absl::Status settled = owner_->replicator->Settle(committed);
  EXPECT_EQ(settled.code(), absl::StatusCode::kUnavailable) << settled;
}

// Replication moves bytes; one model family is enough.
std::vector<ops::testing::FamilyCase> Cases() {
  std::vector<ops::testing::FamilyCase> out;
  for (const auto& c : ops::testing::AllFamilyCases()) {
    if (c.family == "llama" && c.precision == ops::Precision::kF32) {
      out.push_back(c);
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Families, ReplicatorTest, ::testing::ValuesIn(Cases()),
                         ops::testing::FamilyCaseName);

}  // namespace
}  // namespace kvd::migration
