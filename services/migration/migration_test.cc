// Moving a live session between two engines, each with its own store, over
// a real etcd directory, a real gRPC control channel and a real data plane
// (loopback, UCX over TCP, UCX over shared memory): the conversation goes on
// bit-identically to one that never moved, however often it moves, and a
// move that fails (every injected fault, a wrong cluster token) leaves the
// session whole and serving on its source.
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "ops/model/testing/model_cases.h"
#include "ops/model/testing/tiny_model.h"
#include "services/cluster/directory.h"
#include "services/cluster/testing/etcd_process.h"
#include "services/engine/session_engine.h"
#include "services/engine/session_fence.h"
#include "services/engine/testing/engine_fixture.h"
#include "services/migration/inbound.h"
#include "services/migration/migration_service.h"
#include "services/migration/migrator.h"
#include "services/migration/testing/directory_fence_for_test.h"
#include "services/migration/testing/served_migration.h"
#include "services/transport/fault_injecting_transport.h"
#include "services/transport/loopback_transport.h"
#include "services/transport/ucx_transport.h"
#include "storage/checkpoint/ownership.h"

namespace kvd::migration {
namespace {

constexpr char kToken[] = "cluster-secret-for-test";

using testing::DirectoryFenceForTest;

struct Node {
  std::string id;
  std::unique_ptr<storage::TieredStore> store;
  std::unique_ptr<engine::SessionEngine> engine;
  std::unique_ptr<testing::ServedMigration> migration;  // in a cluster
};

struct Transcript {
  std::vector<std::vector<float>> logits;
  std::vector<int32_t> tokens;
};

class MigrationTest : public engine::testing::TinyModelTest {
 protected:
  void SetUp() override {
    ops::testing::TinyModelSpec spec;
    spec.n_layers = 4;
    spec.sliding_window = 24;
    LoadModel(spec);
    if (HasFatalFailure()) return;
    identity_ = engine::ModelIdentityOf(*model_, "sha256:tiny-migration");
    const char* tmp = std::getenv("TEST_TMPDIR");
    auto etcd = cluster::testing::EtcdProcess::Start(tmp ? tmp : "/tmp");
    ASSERT_TRUE(etcd.ok()) << etcd.status();
    etcd_ = std::move(*etcd);
    auto client = cluster::EtcdClient::Connect({.endpoint = etcd_->endpoint()});
    ASSERT_TRUE(client.ok()) << client.status();
    etcd_client_ = std::move(*client);
    directory_ =
        std::make_unique<cluster::SessionDirectory>(etcd_client_.get());
  }

  std::unique_ptr<Node> StartNode(const std::string& id,
                                  transport::Transport* data_plane,
                                  bool in_cluster = true) {
    auto n = std::make_unique<Node>();
    n->id = id;
    auto store = engine::testing::OpenTestStore(
        engine::testing::FreshTestDir(absl::StrCat("node-", id)));
    EXPECT_TRUE(store.ok()) << store.status();
    n->store = std::move(*store);
    engine::SessionEngineOptions o;
    o.node_id = in_cluster ? id : "";
    if (in_cluster) {
      o.fence = std::make_shared<DirectoryFenceForTest>(directory_.get(), id);
    }
    o.chunk_tokens = 16;
    n->engine = std::make_unique<engine::SessionEngine>(*model_, identity_,
                                                        n->store.get(), o);
    if (!in_cluster) return n;
    n->migration = testing::ServeMigration(
        n->engine.get(), data_plane,
        InboundOptions{.idle_timeout = absl::Seconds(3),
                       .commit_wait = absl::Seconds(10)},
        kToken);
    nodes_[id] = n.get();
    return n;
  }

  std::unique_ptr<Migrator> MigratorOf(Node* n, transport::Transport* t,
                                       const std::string& token = kToken) {
    PeerResolver resolve =
        [this](const std::string& id) -> absl::StatusOr<PeerNode> {
      auto it = nodes_.find(id);
      if (it == nodes_.end()) return absl::NotFoundError("no such node");
      return PeerNode{it->second->migration->address, identity_.fingerprint()};
    };
    return std::make_unique<Migrator>(
        n->engine.get(), directory_.get(), t, resolve,
        MigratorOptions{.node_id = n->id,
                        .cluster_token = token,
                        .piece_bytes = 4096,
                        .rpc_timeout = absl::Seconds(30)});
  }

  std::vector<int32_t> TurnTokens(int turn) const {
    return ops::testing::RandomTokens(9 + 7 * turn, 100 + turn,
                                      model_->config().vocab_size);
  }

  absl::Status Turn(Node* n, int turn, Transcript* t) {
    engine::TurnRequest r;
    r.tenant = "acme";
    r.session = "chat-1";
    r.tokens = TurnTokens(turn);
    r.create_if_missing = true;
    r.generate.max_tokens = 11;
    r.generate.ignore_eos = true;
    r.generate.sampling.temperature = 0;
    r.generate.on_logits = [t](const float* l, int64_t k) {
      t->logits.emplace_back(l, l + k);
    };
    absl::StatusOr<engine::TurnResult> res =
        n->engine->RunTurn(r, *tokenizer_, nullptr);
    if (!res.ok()) return res.status();
    t->tokens.insert(t->tokens.end(), res->generation.tokens.begin(),
                     res->generation.tokens.end());
    return absl::OkStatus();
  }

  // Four turns in one standalone engine that never lets the session go.
  Transcript Reference() {
    std::unique_ptr<Node> ref = StartNode("ref", nullptr, /*in_cluster=*/false);
    Transcript t;
    for (int turn = 0; turn < 4; ++turn)
      EXPECT_TRUE(Turn(ref.get(), turn, &t).ok());
    return t;
  }

  static std::vector<
      std::pair<std::string, std::unique_ptr<transport::Transport>>>
  DataPlanes(bool with_shared_memory) {
    std::vector<std::pair<std::string, std::unique_ptr<transport::Transport>>>
        out;
    out.emplace_back("loopback",
                     std::make_unique<transport::LoopbackTransport>());
    std::vector<std::string> tls = {"tcp"};
    if (with_shared_memory) tls.push_back("sm");
    for (const std::string& t : tls) {
      auto ucx = transport::UcxTransport::Create(
          {.tls = t, .send_timeout = absl::Seconds(2)});
      EXPECT_TRUE(ucx.ok()) << ucx.status();
      if (ucx.ok()) out.emplace_back("ucx " + t, std::move(*ucx));
    }
    return out;
  }

  v1::ModelIdentity identity_;
  std::unique_ptr<cluster::testing::EtcdProcess> etcd_;
  std::unique_ptr<cluster::EtcdClient> etcd_client_;
  std::unique_ptr<cluster::SessionDirectory> directory_;
  std::map<std::string, Node*> nodes_;
};

TEST_P(MigrationTest, AMovedConversationContinuesBitIdentically) {
  const Transcript reference = Reference();
  int round = 0;
  for (auto& [name, plane] : DataPlanes(/*with_shared_memory=*/true)) {
    SCOPED_TRACE(name);
    nodes_.clear();
    std::unique_ptr<Node> a =
        StartNode("a" + std::to_string(round), plane.get());
    std::unique_ptr<Node> b =
        StartNode("b" + std::to_string(round), plane.get());
    ++round;
    ASSERT_TRUE(
        etcd_client_->Delete(cluster::SessionDirectory::Key("acme", "chat-1"))
            .ok());
    ASSERT_TRUE(directory_->Create("acme", "chat-1", a->id).ok());
    auto from_a = MigratorOf(a.get(), plane.get());
    auto from_b = MigratorOf(b.get(), plane.get());
    Transcript got;
    // a, then b, then a again, then b: three moves between four turns.
    Node* where[] = {a.get(), b.get(), a.get(), b.get()};
    for (int turn = 0; turn < 4; ++turn) {
      if (turn > 0) {
        Migrator& m = where[turn - 1] == a.get() ? *from_a : *from_b;
        absl::StatusOr<MigrationReport> r =
            m.Migrate("acme", "chat-1", where[turn]->id);
        ASSERT_TRUE(r.ok()) << r.status();
        EXPECT_EQ(r->epoch, static_cast<uint64_t>(turn + 1));
        EXPECT_EQ(r->turns, turn);
        EXPECT_EQ(r->restore_path, "residuals");
        EXPECT_GT(r->snapshot_bytes, 0);
        EXPECT_GT(r->wire_bytes, r->snapshot_bytes);
        // The source keeps nothing; the directory names the target.
        EXPECT_EQ(where[turn - 1]
                      ->engine->GetSession("acme", "chat-1")
                      .status()
                      .code(),
                  absl::StatusCode::kNotFound);
        auto e = directory_->Lookup("acme", "chat-1");
        ASSERT_TRUE(e.ok() && e->has_value());
        EXPECT_EQ((*e)->owner, where[turn]->id);
      }
      ASSERT_TRUE(Turn(where[turn], turn, &got).ok()) << "turn " << turn;
    }
    EXPECT_TRUE(
        engine::testing::LogitsBitIdentical(reference.logits, got.logits));
    EXPECT_EQ(reference.tokens, got.tokens);
    EXPECT_EQ(b->engine->stats().replicas_adopted, 2);
  }
}

TEST_P(MigrationTest, EveryFailedMoveLeavesTheSessionServingOnItsSource) {
  const Transcript reference = Reference();
  int round = 0;
  for (auto& [name, plane] : DataPlanes(/*with_shared_memory=*/false)) {
    SCOPED_TRACE(name);
    nodes_.clear();
    std::unique_ptr<Node> a =
        StartNode("fa" + std::to_string(round), plane.get());
    std::unique_ptr<Node> b =
        StartNode("fb" + std::to_string(round), plane.get());
    ++round;
    ASSERT_TRUE(
        etcd_client_->Delete(cluster::SessionDirectory::Key("acme", "chat-1"))
            .ok());
    ASSERT_TRUE(directory_->Create("acme", "chat-1", a->id).ok());
    Transcript got;
    ASSERT_TRUE(Turn(a.get(), 0, &got).ok());
    ASSERT_TRUE(Turn(a.get(), 1, &got).ok());
    using transport::Fault;
    const std::vector<transport::FaultSpec> faults = {
        {Fault::kDrop, 3},     {Fault::kTruncate, 2},   {Fault::kFlipByte, 0},
        {Fault::kFlipByte, 4}, {Fault::kDisconnect, 3}, {Fault::kDuplicate, 1},
        {Fault::kDrop, 1000},  // the last frames: whichever is last
    };
    for (const transport::FaultSpec& f : faults) {
      SCOPED_TRACE(transport::FaultName(f));
      transport::FaultInjectingTransport faulty(plane.get(), f);
      auto m = MigratorOf(a.get(), &faulty);
      absl::StatusOr<MigrationReport> r = m->Migrate("acme", "chat-1", b->id);
      if (f.at_chunk == 1000) {
        // Past the stream's end: nothing was damaged, the move succeeds;
        // move it back for the next fault.
        ASSERT_TRUE(r.ok()) << r.status();
        auto back = MigratorOf(b.get(), plane.get());
        ASSERT_TRUE(back->Migrate("acme", "chat-1", a->id).ok());
        continue;
      }
      EXPECT_FALSE(r.ok());
      auto e = directory_->Lookup("acme", "chat-1");
      ASSERT_TRUE(e.ok() && e->has_value());
      EXPECT_EQ((*e)->owner, a->id);
      EXPECT_TRUE(a->engine->GetSession("acme", "chat-1").ok());
      EXPECT_EQ(b->engine->GetSession("acme", "chat-1").status().code(),
                absl::StatusCode::kNotFound);
    }
    // A wrong cluster token is refused before anything is sent.
    auto forged = MigratorOf(a.get(), plane.get(), "not-the-token");
    EXPECT_EQ(forged->Migrate("acme", "chat-1", b->id).status().code(),
              absl::StatusCode::kPermissionDenied);
    // The session serves on: its next turns match the reference.
    ASSERT_TRUE(Turn(a.get(), 2, &got).ok());
    ASSERT_TRUE(Turn(a.get(), 3, &got).ok());
    EXPECT_TRUE(
        engine::testing::LogitsBitIdentical(reference.logits, got.logits));
    EXPECT_GE(b->migration->inbound->stats().failed, 6);
  }
}

// A turn that starts while the session is being copied finishes first (the
// freeze waits for it) and travels in the delta.
TEST_P(MigrationTest, ATurnRunningDuringTheCopyTravelsInTheDelta) {
  const Transcript reference = Reference();
  transport::LoopbackTransport plane;
  std::unique_ptr<Node> a = StartNode("da", &plane);
  std::unique_ptr<Node> b = StartNode("db", &plane);
  ASSERT_TRUE(directory_->Create("acme", "chat-1", a->id).ok());
  Transcript got;
  ASSERT_TRUE(Turn(a.get(), 0, &got).ok());
  // The data plane is slow, so turn 1 runs while the snapshot is sent.
  transport::FaultInjectingTransport slow(
      &plane, {transport::Fault::kDelay, 0, absl::Milliseconds(30)});
  auto m = MigratorOf(a.get(), &slow);
  absl::StatusOr<MigrationReport> r;
  std::thread mover([&] { r = m->Migrate("acme", "chat-1", b->id); });
  // The snapshot is read before the transfer opens, so a turn started
  // once it is open is not in the snapshot; the slow plane keeps the
  // snapshot's frames travelling while the turn runs.
  for (int waited_ms = 0;
       b->migration->inbound->stats().opened == 0 && waited_ms < 30000;
       ++waited_ms) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_TRUE(Turn(a.get(), 1, &got).ok());
  mover.join();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->turns, 2);
  EXPECT_GT(r->delta_chunks, 0);  // turn 1's rows went in the delta
  ASSERT_TRUE(Turn(b.get(), 2, &got).ok());
  ASSERT_TRUE(Turn(b.get(), 3, &got).ok());
  EXPECT_TRUE(
      engine::testing::LogitsBitIdentical(reference.logits, got.logits));
}

std::vector<ops::testing::FamilyCase> Cases() {
  std::vector<ops::testing::FamilyCase> out;
  for (const auto& c : ops::testing::AllFamilyCases()) {
    // One family per precision keeps the test short; the engine's own tests
    // cover every family's resume paths.
    if ((c.family == "llama" && c.precision == ops::Precision::kBf16) ||
        (c.family == "gemma3" && c.precision == ops::Precision::kF32)) {
      out.push_back(c);
    }
  }
  return out;
}

// A drain and an operator's move can ask this node to move the same session
// at once. The second is refused while the first runs (both staging copies
// on one target, the loser's abort there would drop the winner's committed
// copy), and the first one's move stands.
TEST_P(MigrationTest, ASecondMoveOfTheSameSessionIsRefusedWhileOneRuns) {
  transport::LoopbackTransport plane;
  std::unique_ptr<Node> a = StartNode("ca", &plane);
  std::unique_ptr<Node> b = StartNode("cb", &plane);
  ASSERT_TRUE(directory_->Create("acme", "chat-1", a->id).ok());
  Transcript got;
  ASSERT_TRUE(Turn(a.get(), 0, &got).ok());

  // The first move waits inside its peer lookup until released.
  absl::Notification entered, release;
  std::atomic<int> lookups{0};
  PeerResolver resolve =
      [&](const std::string& id) -> absl::StatusOr<PeerNode> {
    if (lookups.fetch_add(1) == 0) {
      entered.Notify();
      release.WaitForNotification();
    }
    return PeerNode{nodes_.at(id)->migration->address, identity_.fingerprint()};
  };
  Migrator m(a->engine.get(), directory_.get(), &plane, resolve,
             MigratorOptions{.node_id = a->id,
                             .cluster_token = kToken,
                             .piece_bytes = 4096,
                             .rpc_timeout = absl::Seconds(30)});
  absl::StatusOr<MigrationReport> first;
  std::thread mover([&] { first = m.Migrate("acme", "chat-1", b->id); });
  entered.WaitForNotification();
  absl::StatusOr<MigrationReport> second = m.Migrate("acme", "chat-1", b->id);
  release.Notify();
  mover.join();
  EXPECT_EQ(second.status().code(), absl::StatusCode::kAborted)
      << second.status();
  EXPECT_NE(second.status().message().find("being moved"), std::string::npos)
      << second.status();
  ASSERT_TRUE(first.ok()) << first.status();
  // The move stands: b serves the next turn from the copy it received.
  ASSERT_TRUE(Turn(b.get(), 1, &got).ok());
  // After it, a no longer owns the session: a new move is refused by the
  // directory, not by the guard.
  absl::StatusOr<MigrationReport> late = m.Migrate("acme", "chat-1", b->id);
  EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition)
      << late.status();
}

INSTANTIATE_TEST_SUITE_P(Families, MigrationTest, ::testing::ValuesIn(Cases()),
                         ops::testing::FamilyCaseName);

}  // namespace
}  // namespace kvd::migration
