// A durable session continues bit-identically however its state comes back:
// hot, from the DRAM tier, from RocksDB after the store is closed and opened
// again (a restart), or by re-prefilling when a stored chunk is corrupt. The
// reference is the same conversation run in one engine that never lets the
// session go cold; every step's logits are compared bit for bit.
#include "services/engine/session_engine.h"

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "ops/model/testing/model_cases.h"
#include "ops/model/testing/tiny_model.h"
#include "rocksdb/db.h"
#include "services/engine/testing/engine_fixture.h"
#include "storage/checkpoint/ownership.h"
#include "storage/rocksdb/keys.h"
#include "storage/tiered/testing/sessions.h"

namespace kvd::engine {
namespace {

constexpr int kTurns = 4;

// A SessionFence whose answers the test sets: a test double for the node's
// etcd-backed fence (services/node/cluster_fence.h, tested against a real
// etcd in tests/cluster).
class FenceTestDouble : public SessionFence {
 public:
  absl::StatusOr<uint64_t> OwnedEpoch(const std::string&,
                                      const std::string&) override {
    absl::MutexLock lock(&mu_);
    return owned_;
  }
  absl::Status MayCommit(const std::string&, const std::string&,
                         uint64_t epoch) override {
    absl::MutexLock lock(&mu_);
    last_commit_epoch_ = epoch;
    return may_commit_;
  }
  absl::Status Ready() override {
    absl::MutexLock lock(&mu_);
    return may_commit_;
  }
  absl::StatusOr<bool> HasCommitsElsewhere(const std::string&,
                                           const std::string&) override {
    absl::MutexLock lock(&mu_);
    return elsewhere_;
  }
  void SetCommitsElsewhere(bool elsewhere) {
    absl::MutexLock lock(&mu_);
    elsewhere_ = elsewhere;
  }
  void Set(absl::StatusOr<uint64_t> owned, absl::Status may_commit) {
    absl::MutexLock lock(&mu_);
    owned_ = std::move(owned);
    may_commit_ = std::move(may_commit);
  }
  uint64_t last_commit_epoch() {
    absl::MutexLock lock(&mu_);
    return last_commit_epoch_;
  }

 private:
  absl::Mutex mu_;
  absl::StatusOr<uint64_t> owned_ = uint64_t{1};
  absl::Status may_commit_;
  bool elsewhere_ = false;
  uint64_t last_commit_epoch_ = 0;
};

struct Transcript {
  std::vector<std::vector<float>> logits;  // one entry per generated step
  std::vector<int32_t> tokens;             // every generated token
  std::vector<StatePath> paths;            // per turn
  std::vector<std::string> details;
  // Per turn, the engine's restores so far that rebuilt layers as they were
  // read from RocksDB (EngineStats::restores_streamed).
  std::vector<int64_t> streamed;
};

struct Variant {
  std::string policy;
  int64_t hot_budget;
};

class SessionEngineTest : public testing::EngineTest {
 protected:
  void SetUp() override {
    ops::testing::TinyModelSpec spec;
    spec.n_layers = 4;
    spec.sliding_window = 24;  // gemma3: windows slide within the test
    LoadModel(spec);
    if (HasFatalFailure()) return;
    identity_ = ModelIdentityOf(*model_, "sha256:tiny-" + GetParam().family);
    FreshDir();
  }

  // A new, empty database directory for the next conversation.
  void FreshDir() {
    engine_.reset();
    store_.reset();
    dir_ = testing::FreshTestDir("sessions");
  }

  // The store of dir_, opened again (a restart) if it was open.
  void OpenStore() {
    engine_.reset();
    store_.reset();
    auto store = testing::OpenTestStore(dir_);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
  }

  void NewEngine(const Variant& v, const v1::ModelIdentity& identity,
                 const std::string& node_id = "",
                 std::shared_ptr<SessionFence> fence = nullptr) {
    SessionEngineOptions o;
    o.node_id = node_id;
    o.fence = std::move(fence);
    o.policy = *ops::ParseCheckpointPolicy(v.policy);
    o.hot_budget = v.hot_budget;
    o.chunk_tokens = 16;
    if (customize_) customize_(o);
    engine_ =
        std::make_unique<SessionEngine>(*model_, identity, store_.get(), o);
  }

  // The turn's new tokens: a fixed function of the turn number.
  std::vector<int32_t> TurnTokens(int turn) const {
    return ops::testing::RandomTokens(9 + 7 * turn, 100 + turn,
                                      model_->config().vocab_size);
  }

  // A greedy turn of acme/chat-1 with turn `turn`'s tokens.
  TurnRequest Request(int turn, int64_t max_tokens) const {
    TurnRequest r;
    r.tenant = "acme";
    r.session = "chat-1";
    r.tokens = TurnTokens(turn);
    r.generate.max_tokens = max_tokens;
    r.generate.ignore_eos = true;
    r.generate.sampling.temperature = 0;
    return r;
  }

  // Holds a turn at its first step, with the session's lock held, until
  // the test opens the gate.
  struct Gate {
    std::atomic<bool> entered{false};
    std::atomic<bool> open{false};
  };
  static void HoldAtFirstStep(TurnRequest& r, Gate* gate) {
    r.generate.on_logits = [gate](const float*, int64_t) {
      gate->entered = true;
      while (!gate->open) absl::SleepFor(absl::Milliseconds(1));
    };
  }

  absl::StatusOr<TurnResult> Turn(int turn, Transcript* t,
                                  int cancel_after = -1) {
    TurnRequest r = Request(turn, 11);
    r.create_if_missing = create_if_missing_;
    int steps = 0;
    r.generate.on_logits = [t, &steps](const float* l, int64_t n) {
      t->logits.emplace_back(l, l + n);
      ++steps;
    };
    if (cancel_after >= 0)
      r.generate.cancelled = [&steps, cancel_after] {
        return steps >= cancel_after;
      };
    absl::StatusOr<TurnResult> res = engine_->RunTurn(r, *tokenizer_, nullptr);
    if (res.ok()) {
      t->tokens.insert(t->tokens.end(), res->generation.tokens.begin(),
                       res->generation.tokens.end());
      t->paths.push_back(res->path);
      t->details.push_back(res->path_detail);
      t->streamed.push_back(engine_->stats().restores_streamed);
    }
    return res;
  }

  // Runs the conversation; between turns, `between` may make the session
  // cold.
  Transcript Converse(const Variant& v, const std::function<void()>& between) {
    FreshDir();
    OpenStore();
    NewEngine(v, identity_);
    // Labels: a manifest with a map, whose copies need not serialize alike.
    EXPECT_TRUE(
        engine_->CreateSession("acme", "chat-1", {{"app", "a"}, {"team", "t"}})
            .ok());
    Transcript t;
    for (int turn = 0; turn < kTurns; ++turn) {
      if (turn > 0 && between) between();
      absl::StatusOr<TurnResult> r = Turn(turn, &t);
      EXPECT_TRUE(r.ok()) << r.status();
      if (!r.ok()) break;
    }
    return t;
  }

  static void ExpectSameBits(const Transcript& a, const Transcript& b) {
    ASSERT_TRUE(testing::LogitsBitIdentical(a.logits, b.logits));
    EXPECT_EQ(a.tokens, b.tokens);
  }

  // Flips one byte of the stored value of residual chunk (layer, index).
  void CorruptStoredChunk(int64_t layer, int64_t index) {
    engine_.reset();
    store_.reset();
    rocksdb::Options o;
    std::vector<rocksdb::ColumnFamilyDescriptor> cfs;
    for (const char* name : {"default", "manifests", "tokens", "residuals"})
      cfs.emplace_back(name, rocksdb::ColumnFamilyOptions());
    std::vector<rocksdb::ColumnFamilyHandle*> handles;
    rocksdb::DB* raw = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(o, dir_, cfs, &handles, &raw).ok());
    std::unique_ptr<rocksdb::DB> db(raw);
    const std::string key =
        storage::ChunkKey("acme", "chat-1", storage::ChunkId{layer, index});
    std::string value;
    ASSERT_TRUE(db->Get({}, handles[3], key, &value).ok());
    value[value.size() / 2] ^= 0x40;
    ASSERT_TRUE(db->Put({}, handles[3], key, value).ok());
    for (auto* h : handles) db->DestroyColumnFamilyHandle(h);
  }

  v1::ModelIdentity identity_;
  std::string dir_;
  bool create_if_missing_ = false;  // Turn's TurnRequest.create_if_missing
  // Applied to the options of every engine NewEngine makes (hooks).
  std::function<void(SessionEngineOptions&)> customize_;
};

const Variant kVariants[] = {
    {"kv", ops::ResidualKvSource::kAll},
    {"kv-direct", ops::ResidualKvSource::kAll},
    {"kv-direct", 16},
    {"stride:2", ops::ResidualKvSource::kAll},
    {"tokens", ops::ResidualKvSource::kAll},
};

TEST_P(SessionEngineTest, EveryResumePathContinuesBitIdentically) {
  for (const Variant& v : kVariants) {
    SCOPED_TRACE(v.policy + " hot budget " + std::to_string(v.hot_budget));
    const Transcript hot = Converse(v, nullptr);
    ASSERT_EQ(hot.paths.size(), kTurns);
    for (int i = 1; i < kTurns; ++i) EXPECT_EQ(hot.paths[i], StatePath::kHot);

    // Demoted between turns: the checkpoint comes back from DRAM.
    const Transcript dram =
        Converse(v, [&] { engine_->Suspend("acme", "chat-1"); });
    ExpectSameBits(hot, dram);
    const StatePath cold_path =
        v.policy == "tokens" ? StatePath::kReprefill : StatePath::kDram;
    for (int i = 1; i < kTurns; ++i) EXPECT_EQ(dram.paths[i], cold_path);

    // A restart between turns: new store, new engine, state from RocksDB.
    const Transcript restart = Converse(v, [&] {
      OpenStore();
      NewEngine(v, identity_);
    });
    ExpectSameBits(hot, restart);
    const StatePath disk_path =
        v.policy == "tokens" ? StatePath::kReprefill : StatePath::kRocksDb;
    for (int i = 1; i < kTurns; ++i) EXPECT_EQ(restart.paths[i], disk_path);
    // Residual policies rebuild each layer as it is read (each turn has a
    // new engine); kv copies and tokens re-prefill, with nothing to overlap.
    const bool streams = v.policy == "kv-direct" || v.policy == "stride:2";
    for (int i = 1; i < kTurns; ++i) {
      EXPECT_EQ(restart.streamed[i], streams ? 1 : 0) << "turn " << i;
    }
    for (int i = 1; i < kTurns; ++i) EXPECT_EQ(dram.streamed[i], 0);
    if (v.policy == "tokens") {
      EXPECT_NE(restart.details[1].find("token ids only"), std::string::npos);
    }
  }
}

TEST_P(SessionEngineTest, CorruptChunkIsReportedAndReprefilledExactly) {
  const Variant v{"kv-direct", ops::ResidualKvSource::kAll};
  const Transcript reference = Converse(v, nullptr);
  bool corrupted = false;
  const Transcript got = Converse(v, [&] {
    if (!corrupted) {
      CorruptStoredChunk(/*layer=*/1, /*index=*/0);
      corrupted = true;
    }
    OpenStore();
    NewEngine(v, identity_);
  });
  ExpectSameBits(reference, got);
  ASSERT_EQ(got.paths.size(), kTurns);
  EXPECT_EQ(got.paths[1], StatePath::kReprefill);
  EXPECT_NE(got.details[1].find("layer 1"), std::string::npos)
      << got.details[1];
  // The streamed rebuild met the bad chunk and gave way to the whole path.
  EXPECT_EQ(got.streamed[1], 0);
  EXPECT_EQ(got.streamed[2], 1);
  // The re-prefill rewrote every chunk: later restarts read them again.
  EXPECT_EQ(got.paths[2], StatePath::kRocksDb);
  EXPECT_EQ(got.paths[3], StatePath::kRocksDb);
}

// What salvage exports of a session whose residuals are lost (TokensOnly):
// imported into a fresh store, it continues bit-identically, its next turn
// runs the stored tokens through the model again (nothing counts as cached),
// and that turn stores the residuals anew.
TEST_P(SessionEngineTest, SalvagedTokensOnlySessionContinuesBitIdentically) {
  for (const Variant& v : kVariants) {
    SCOPED_TRACE(v.policy + " hot budget " + std::to_string(v.hot_budget));
    const Transcript reference = Converse(v, nullptr);
    bool salvaged = false;
    const Transcript got = Converse(v, [&] {
      if (salvaged) return;
      salvaged = true;
      absl::StatusOr<storage::SessionCheckpoint> whole =
          store_->db().Load("acme", "chat-1");
      ASSERT_TRUE(whole.ok()) << whole.status();
      absl::StatusOr<storage::SessionCheckpoint> tokens =
          storage::TokensOnly(*whole);
      ASSERT_TRUE(tokens.ok()) << tokens.status();
      EXPECT_EQ(tokens->manifest().length(), 0);
      EXPECT_EQ(tokens->manifest().token_count(),
                whole->manifest().token_count());
      FreshDir();
      OpenStore();
      NewEngine(v, identity_);
      ASSERT_TRUE(engine_->ImportSession(*tokens).ok());
    });
    ExpectSameBits(reference, got);
    ASSERT_EQ(got.paths.size(), kTurns);
    EXPECT_EQ(got.paths[1], StatePath::kReprefill);
    if (v.policy != "tokens") {
      EXPECT_NE(got.details[1].find("salvaged"), std::string::npos)
          << got.details[1];
    }
    // The stored residuals came back with the salvaged turn: a restart now
    // reads them.
    OpenStore();
    absl::StatusOr<storage::SessionCheckpoint> after =
        store_->db().Load("acme", "chat-1");
    ASSERT_TRUE(after.ok()) << after.status();
    EXPECT_EQ(after->manifest().length(), after->manifest().token_count() - 1);
  }
}

// Handing a session to another node: Freeze holds its turns, Release makes
// the copy here a replica (unlisted, refusing turns, the held turn told so),
// and the new owner's Adopt continues the conversation bit-identically.
TEST_P(SessionEngineTest, FreezeReleaseAdoptContinuesBitIdentically) {
  const Variant v{"kv-direct", ops::ResidualKvSource::kAll};
  const Transcript reference = Converse(v, nullptr);
  int between = 0;
  const Transcript got = Converse(v, [&] {
    if (++between != 2) return;  // after two turns
    absl::StatusOr<SessionEngine::FrozenSession> frozen =
        engine_->Freeze("acme", "chat-1");
    ASSERT_TRUE(frozen.ok()) << frozen.status();
    EXPECT_EQ(frozen->turns, 2u);
    EXPECT_EQ(frozen->epoch, storage::kFirstEpoch);
    // A server's turn is refused at once (it must not hold its slot)...
    TurnRequest busy = Request(2, 4);
    busy.fail_if_busy = true;
    const absl::Status refused =
        engine_->RunTurn(busy, *tokenizer_, nullptr).status();
    EXPECT_EQ(refused.code(), absl::StatusCode::kAborted) << refused;
    EXPECT_NE(refused.message().find("being moved"), std::string::npos);
    // ...another waits for the move, then learns where it went.
    absl::Status held;
    std::thread turn([&] {
      TurnRequest r = Request(2, 4);
      held = engine_->RunTurn(r, *tokenizer_, nullptr).status();
    });
    while (engine_->stats().turns_held_frozen < 1) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    EXPECT_EQ(engine_->DeleteSession("acme", "chat-1").code(),
              absl::StatusCode::kFailedPrecondition);
    ASSERT_TRUE(
        engine_->Release("acme", "chat-1", "node-b", frozen->epoch + 1).ok());
    turn.join();
    EXPECT_EQ(held.code(), absl::StatusCode::kAborted) << held;
    EXPECT_NE(held.message().find("replica"), std::string::npos) << held;
    EXPECT_EQ(engine_->GetSession("acme", "chat-1").status().code(),
              absl::StatusCode::kNotFound);
    absl::StatusOr<storage::SessionListPage> page =
        store_->List("acme", "", 10);
    ASSERT_TRUE(page.ok());
    EXPECT_TRUE(page->sessions.empty());
    // Node b opens the store and adopts the session at the new epoch; its
    // turns continue from there.
    OpenStore();
    NewEngine(v, identity_, "node-b");
    ASSERT_TRUE(engine_->Adopt("acme", "chat-1", frozen->epoch + 1).ok());
    absl::StatusOr<v1::SessionManifest> m =
        engine_->GetSession("acme", "chat-1");
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->owner_node(), "node-b");
    EXPECT_EQ(m->epoch(), 2u);
    EXPECT_EQ(m->turn_ends_size(), 2);
  });
  ExpectSameBits(reference, got);
  // The old owner (a standalone engine) cannot commit to it any more.
  OpenStore();
  NewEngine(v, identity_);
  Transcript t;
  absl::StatusOr<TurnResult> stale = Turn(4, &t);
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kAborted);
  EXPECT_NE(stale.status().message().find("moved"), std::string::npos)
      << stale.status();
}

// A migration's target: another node's committed copy is stored as a
// replica, refused while the directory still names the old epoch, and
// adopted by the first turn once the directory gives it the next epoch; the
// conversation continues bit-identically.
TEST_P(SessionEngineTest, StoredReplicaIsAdoptedByTheNextTurnBitIdentically) {
  const Variant v{"kv-direct", ops::ResidualKvSource::kAll};
  const Transcript reference = Converse(v, nullptr);
  int between = 0;
  const Transcript got = Converse(v, [&] {
    if (++between != 2) return;  // after two turns
    absl::StatusOr<std::shared_ptr<const storage::SessionCheckpoint>> sent =
        engine_->ExportSession("acme", "chat-1");
    ASSERT_TRUE(sent.ok()) << sent.status();
    storage::SessionCheckpoint copy = **sent;
    // Node b: a fresh store, the directory still at the source's epoch.
    FreshDir();
    OpenStore();
    auto fence = std::make_shared<FenceTestDouble>();
    NewEngine(v, identity_, "node-b", fence);
    ASSERT_TRUE(engine_->StoreReplica(copy).ok());
    EXPECT_EQ(engine_->GetSession("acme", "chat-1").status().code(),
              absl::StatusCode::kNotFound);  // a replica is not live
    Transcript ignored;
    EXPECT_FALSE(Turn(2, &ignored).ok());
    // An older copy does not replace it.
    storage::SessionCheckpoint older = copy;
    v1::SessionManifest m = older.manifest();
    m.set_epoch(0);
    older.ReplaceManifest(m);
    ASSERT_TRUE(engine_->StoreReplica(older).ok());  // epoch 0 reads as 1
    // The directory moves the session to node b at the next epoch.
    fence->Set(storage::EpochOf(copy.manifest()) + 1, absl::OkStatus());
  });
  ExpectSameBits(reference, got);
  EXPECT_EQ(engine_->stats().replicas_adopted, 1);
  absl::StatusOr<v1::SessionManifest> m = engine_->GetSession("acme", "chat-1");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->owner_node(), "node-b");
  EXPECT_EQ(m->epoch(), 2u);
  // Now primary here at epoch 2: a copy from epoch 1 is refused.
  storage::SessionCheckpoint stale;
  v1::SessionManifest old = *m;
  old.set_epoch(1);
  old.set_owner_node("node-a");
  stale.Reset(old, {});
  EXPECT_EQ(engine_->StoreReplica(stale).code(), absl::StatusCode::kAborted);
}

// A migration's target drops a copy on a failed commit or an abort only
// while the copy is still the one that transfer stored: a copy a second
// transfer of the same session stored since, or one a turn adopted, is kept
// (a drain and an operator's move once raced this way, and the loser's abort
// deleted the winner's committed copy).
TEST_P(SessionEngineTest, AFailedTransferDropsOnlyTheCopyItStaged) {
  const Variant v{"kv-direct", ops::ResidualKvSource::kAll};
  const Transcript reference = Converse(v, nullptr);
  int between = 0;
  const Transcript got = Converse(v, [&] {
    if (++between != 2) return;
    absl::StatusOr<std::shared_ptr<const storage::SessionCheckpoint>> sent =
        engine_->ExportSession("acme", "chat-1");
    ASSERT_TRUE(sent.ok()) << sent.status();
    const storage::SessionCheckpoint copy = **sent;
    FreshDir();
    OpenStore();
    auto fence = std::make_shared<FenceTestDouble>();
    NewEngine(v, identity_, "node-b", fence);
    auto staged_by = [&]() -> std::string {
      absl::StatusOr<v1::SessionManifest> m =
          engine_->GetReplica("acme", "chat-1");
      return m.ok() ? m->staged_by() : "(" + m.status().ToString() + ")";
    };
    ASSERT_TRUE(engine_->StoreReplica(copy, "transfer-1").ok());
    ASSERT_TRUE(engine_->StoreReplica(copy, "transfer-2").ok());
    EXPECT_EQ(staged_by(), "transfer-2");
    // The first transfer's copy was replaced: its abort drops nothing.
    EXPECT_TRUE(engine_->DropReplica("acme", "chat-1", "transfer-1").ok());
    EXPECT_EQ(staged_by(), "transfer-2");
    // The second transfer's own copy goes.
    EXPECT_TRUE(engine_->DropReplica("acme", "chat-1", "transfer-2").ok());
    EXPECT_EQ(engine_->GetReplica("acme", "chat-1").status().code(),
              absl::StatusCode::kNotFound);
    // Without a transfer id (a replica an update failed on), whatever is
    // stored goes.
    ASSERT_TRUE(engine_->StoreReplica(copy, "transfer-3").ok());
    EXPECT_TRUE(engine_->DropReplica("acme", "chat-1").ok());
    EXPECT_EQ(engine_->GetReplica("acme", "chat-1").status().code(),
              absl::StatusCode::kNotFound);
    // Staged again, then the directory gives node b the session: adopted by
    // the next turn, and a late abort of that transfer cannot touch it.
    ASSERT_TRUE(engine_->StoreReplica(copy, "transfer-4").ok());
    fence->Set(storage::EpochOf(copy.manifest()) + 1, absl::OkStatus());
  });
  ExpectSameBits(reference, got);
  EXPECT_EQ(engine_->stats().replicas_adopted, 1);
  EXPECT_EQ(engine_->DropReplica("acme", "chat-1", "transfer-4").code(),
            absl::StatusCode::kFailedPrecondition);  // live here now
  absl::StatusOr<v1::SessionManifest> m = engine_->GetSession("acme", "chat-1");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->staged_by(), "");
}

// In a cluster the fence decides: a session the directory lacks is not
// served (not even started), one placed here is started by its first turn,
// a commit the fence refuses writes nothing, a copy older than the
// directory's epoch is not served, and an import is stored at the
// directory's epoch.
TEST_P(SessionEngineTest, ClusterFenceDecidesWhatIsServedAndCommitted) {
  const Variant v{"kv-direct", ops::ResidualKvSource::kAll};
  const Transcript reference = Converse(v, nullptr);
  FreshDir();
  OpenStore();
  auto fence = std::make_shared<FenceTestDouble>();
  NewEngine(v, identity_, "n1", fence);
  Transcript t, scratch;

  fence->Set(absl::NotFoundError("not in the directory"), absl::OkStatus());
  create_if_missing_ = true;
  EXPECT_EQ(Turn(0, &scratch).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->GetManifest("acme", "chat-1").status().code(),
            absl::StatusCode::kNotFound);

  create_if_missing_ = false;
  fence->Set(uint64_t{1}, absl::OkStatus());
  // The directory lists replicas, so the session has turns somewhere: a
  // node without a copy (its disk wiped) does not start it again empty.
  fence->SetCommitsElsewhere(true);
  const absl::Status wiped = Turn(0, &scratch).status();
  EXPECT_EQ(wiped.code(), absl::StatusCode::kFailedPrecondition) << wiped;
  EXPECT_NE(wiped.message().find("holds no copy"), std::string::npos);
  EXPECT_EQ(store_->GetManifest("acme", "chat-1").status().code(),
            absl::StatusCode::kNotFound);
  fence->SetCommitsElsewhere(false);
  absl::StatusOr<TurnResult> first = Turn(0, &t);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(fence->last_commit_epoch(), 1u);

  fence->Set(uint64_t{1}, absl::UnavailableError("lease lapsed"));
  EXPECT_EQ(engine_->WriteHealth().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Turn(1, &scratch).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(store_->GetManifest("acme", "chat-1")->turn_ends_size(), 1);

  // Given back at a later epoch, the copy here may be missing turns
  // committed elsewhere: refused, nothing written.
  fence->Set(uint64_t{3}, absl::OkStatus());
  EXPECT_TRUE(engine_->WriteHealth().ok());
  EXPECT_EQ(Turn(1, &scratch).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store_->GetManifest("acme", "chat-1")->epoch(), 1u);

  // At the directory's epoch the conversation continues bit-identically.
  fence->Set(uint64_t{1}, absl::OkStatus());
  for (int turn = 1; turn < kTurns; ++turn) {
    absl::StatusOr<TurnResult> r = Turn(turn, &t);
    ASSERT_TRUE(r.ok()) << r.status();
  }
  EXPECT_EQ(fence->last_commit_epoch(), 1u);
  absl::StatusOr<v1::SessionManifest> m = store_->GetManifest("acme", "chat-1");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->owner_node(), "n1");
  ExpectSameBits(reference, t);

  // An import is stored only where the fence places it, at its epoch (how
  // a session comes back with its current copy).
  fence->Set(uint64_t{1}, absl::OkStatus());
  absl::StatusOr<std::shared_ptr<const storage::SessionCheckpoint>> exported =
      engine_->ExportSession("acme", "chat-1");
  ASSERT_TRUE(exported.ok()) << exported.status();
  const storage::SessionCheckpoint copy = **exported;
  ASSERT_TRUE(engine_->DeleteSession("acme", "chat-1").ok());
  fence->Set(absl::NotFoundError("not placed"), absl::OkStatus());
  EXPECT_EQ(engine_->ImportSession(copy).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->GetManifest("acme", "chat-1").status().code(),
            absl::StatusCode::kNotFound);
  fence->Set(uint64_t{7}, absl::OkStatus());
  ASSERT_TRUE(engine_->ImportSession(copy).ok());
  EXPECT_EQ(store_->GetManifest("acme", "chat-1")->epoch(), 7u);
  EXPECT_EQ(store_->GetManifest("acme", "chat-1")->owner_node(), "n1");
}

// A cluster node whose replicas cannot be confirmed to hold a turn
// (on_commit fails) keeps the turn committed but does not acknowledge it: the
// answer says it may or may not have committed. Its resend is recognised once
// the replicas are settled (before_turn), and nothing runs while they are not.
TEST_P(SessionEngineTest, ATurnItsReplicasMayLackIsNotAcknowledged) {
  const Variant v{"kv-direct", ops::ResidualKvSource::kAll};
  OpenStore();
  absl::Status replicated = absl::UnavailableError("replica set unreadable");
  absl::Status settled = absl::OkStatus();
  customize_ = [&](SessionEngineOptions& o) {
    o.on_commit = [&](const storage::TurnUpdate&) { return replicated; };
    o.before_turn = [&](const v1::SessionManifest&) { return settled; };
  };
  NewEngine(v, identity_);
  ASSERT_TRUE(engine_->CreateSession("acme", "chat-1", {}).ok());
  TurnRequest r = Request(0, 3);
  r.request_id = "req-1";
  const absl::Status first = engine_->RunTurn(r, *tokenizer_, nullptr).status();
  EXPECT_EQ(first.code(), absl::StatusCode::kUnavailable) << first;
  EXPECT_NE(first.message().find("may or may not have committed"),
            std::string::npos)
      << first;
  EXPECT_EQ(store_->GetManifest("acme", "chat-1")->turn_ends_size(), 1);

  settled = absl::UnavailableError("etcd unreachable");
  const absl::Status held = engine_->RunTurn(r, *tokenizer_, nullptr).status();
  EXPECT_EQ(held.code(), absl::StatusCode::kUnavailable) << held;
  EXPECT_NE(held.message().find("etcd unreachable"), std::string::npos);
  EXPECT_EQ(NotRunReason(held), "replicas");

  settled = replicated = absl::OkStatus();
  absl::StatusOr<TurnResult> resent = engine_->RunTurn(r, *tokenizer_, nullptr);
  ASSERT_TRUE(resent.ok()) << resent.status();
  EXPECT_TRUE(resent->replayed);
  EXPECT_EQ(store_->GetManifest("acme", "chat-1")->turn_ends_size(), 1);
  r.request_id = "req-2";
  ASSERT_TRUE(engine_->RunTurn(r, *tokenizer_, nullptr).ok());
  EXPECT_EQ(store_->GetManifest("acme", "chat-1")->turn_ends_size(), 2);
  customize_ = nullptr;
}

// A retried request (same id as the session's last committed turn) is
// recognised and not committed twice, even after a restart: it gets the
// reply its first attempt committed, bit for bit, as the result and as one
// delta, and nothing runs.
TEST_P(SessionEngineTest, RetriedRequestIdGetsTheCommittedReplyAgain) {
  const Variant v{"kv-direct", ops::ResidualKvSource::kAll};
  OpenStore();
  NewEngine(v, identity_);
  ASSERT_TRUE(engine_->CreateSession("acme", "chat-1", {}).ok());
  TurnRequest r = Request(0, 3);
  r.request_id = "req-1";
  r.generate.stop = {"\n"};  // the text a stop string cut is what is stored
  absl::StatusOr<TurnResult> first = engine_->RunTurn(r, *tokenizer_, nullptr);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(first->replayed);
  OpenStore();  // a restart: the id and the reply are stored with the turn
  NewEngine(v, identity_);
  std::vector<GenerateDelta> deltas;
  r.generate.on_logits = [](const float*, int64_t) {
    ADD_FAILURE() << "a replayed turn ran the model";
  };
  absl::StatusOr<TurnResult> again = engine_->RunTurn(
      r, *tokenizer_, [&](const GenerateDelta& d) { deltas.push_back(d); });
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->replayed);
  EXPECT_EQ(again->generation.tokens, first->generation.tokens);
  EXPECT_EQ(again->generation.text, first->generation.text);
  EXPECT_EQ(again->generation.finish_reason, first->generation.finish_reason);
  EXPECT_EQ(again->context_tokens, first->context_tokens);
  EXPECT_EQ(again->cached_tokens, first->cached_tokens);
  EXPECT_EQ(again->session_tokens, first->session_tokens);
  EXPECT_EQ(again->turn, first->turn);
  ASSERT_EQ(deltas.size(), 1u);
  EXPECT_EQ(deltas[0].tokens, first->generation.tokens);
  EXPECT_EQ(deltas[0].text, first->generation.text);
  EXPECT_EQ(store_->GetManifest("acme", "chat-1")->turn_ends_size(), 1);
  EXPECT_EQ(engine_->stats().turns_replayed, 1);
  EXPECT_EQ(engine_->stats().turns_committed, 0);
  r.generate.on_logits = nullptr;
  r.request_id = "req-2";
  ASSERT_TRUE(engine_->RunTurn(r, *tokenizer_, nullptr).ok());
  r.request_id = "";  // no id: no check
  ASSERT_TRUE(engine_->RunTurn(r, *tokenizer_, nullptr).ok());
  EXPECT_EQ(store_->GetManifest("acme", "chat-1")->turn_ends_size(), 3);
}

// Freeze lets a running turn finish (its commit is part of the frozen
// state) before it returns.
TEST_P(SessionEngineTest, FreezeWaitsForTheRunningTurn) {
  const Variant v{"kv-direct", ops::ResidualKvSource::kAll};
  OpenStore();
  NewEngine(v, identity_);
  ASSERT_TRUE(engine_->CreateSession("acme", "chat-1", {}).ok());
  Gate gate;
  TurnRequest r = Request(0, 4);
  HoldAtFirstStep(r, &gate);
  std::thread turn(
      [&] { EXPECT_TRUE(engine_->RunTurn(r, *tokenizer_, nullptr).ok()); });
  while (!gate.entered) absl::SleepFor(absl::Milliseconds(1));
  std::atomic<bool> frozen_returned{false};
  absl::StatusOr<SessionEngine::FrozenSession> frozen;
  std::thread freezer([&] {
    frozen = engine_->Freeze("acme", "chat-1");
    frozen_returned = true;
  });
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(frozen_returned);  // the turn still runs
  gate.open = true;
  turn.join();
  freezer.join();
  ASSERT_TRUE(frozen.ok()) << frozen.status();
  EXPECT_EQ(frozen->turns, 1u);
  // The next turn is held until the move is given up, then commits.
  Transcript t;
  absl::StatusOr<TurnResult> next;
  std::thread held([&] { next = Turn(1, &t); });
  while (engine_->stats().turns_held_frozen < 1) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(engine_->GetSession("acme", "chat-1")->turn_ends_size(), 1);
  engine_->Unfreeze("acme", "chat-1");
  held.join();
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->turn, 2u);
}

// Hot state is trusted only while the stored manifest is the one it was
// committed under: when the session moved behind the engine's back (a
// newer epoch stored), the next turn is refused and writes nothing.
TEST_P(SessionEngineTest, HotStateOfAMovedSessionIsNotUsed) {
  const Variant v{"kv-direct", ops::ResidualKvSource::kAll};
  OpenStore();
  NewEngine(v, identity_);
  ASSERT_TRUE(engine_->CreateSession("acme", "chat-1", {}).ok());
  Transcript t;
  ASSERT_TRUE(Turn(0, &t).ok());
  ASSERT_TRUE(engine_->IsHot("acme", "chat-1"));
  absl::StatusOr<v1::SessionManifest> m = store_->GetManifest("acme", "chat-1");
  ASSERT_TRUE(m.ok());
  ASSERT_TRUE(storage::testing::MoveSessionForTest(*store_, "acme", "chat-1",
                                                   "elsewhere", 2)
                  .ok());
  const int64_t steps_before = engine_->stats().scheduler.steps;
  absl::StatusOr<TurnResult> r = Turn(1, &t);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAborted);
  // Refused before anything ran, not at the commit.
  EXPECT_EQ(engine_->stats().scheduler.steps, steps_before);
  EXPECT_NE(r.status().message().find("moved"), std::string::npos)
      << r.status();
  EXPECT_FALSE(engine_->IsHot("acme", "chat-1"));
  EXPECT_EQ(store_->GetManifest("acme", "chat-1")->token_count(),
            m->token_count());
}

TEST_P(SessionEngineTest, CheckpointOfAnotherModelIsRefused) {
  const Variant v{"kv-direct", ops::ResidualKvSource::kAll};
  OpenStore();
  NewEngine(v, identity_);
  ASSERT_TRUE(engine_->CreateSession("acme", "chat-1", {}).ok());
  Transcript t;
  ASSERT_TRUE(Turn(0, &t).ok());
  v1::ModelIdentity other = identity_;
  other.set_fingerprint("sha256:some-other-weights");
  OpenStore();
  NewEngine(v, other);
  absl::StatusOr<TurnResult> r = Turn(1, &t);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("fingerprint"), std::string::npos)
      << r.status();
}

// A checkpoint written under other numerics (the other backend, or a kernel
// build with other reduction orders) keeps good tokens: the session is
// re-prefilled from them on this node's numerics, continues exactly as a
// session that never left, and is rewritten under this node's identity.
TEST_P(SessionEngineTest, CheckpointOfOtherNumericsIsReprefilled) {
  const Variant v{"kv-direct", ops::ResidualKvSource::kAll};
  const Transcript reference = Converse(v, nullptr);
  v1::ModelIdentity other = identity_;
  other.set_numerics_version(identity_.numerics_version() + 1000);
  int switches = 0;
  const Transcript got = Converse(v, [&] {
    OpenStore();
    // Turn 1 runs on "other numerics"; turn 2 back on the original ones.
    NewEngine(v, switches++ == 0 ? other : identity_);
  });
  // The kernels are the same here, so a re-prefill gives the same bits.
  ExpectSameBits(reference, got);
  ASSERT_EQ(got.paths.size(), kTurns);
  EXPECT_EQ(got.paths[1], StatePath::kReprefill);
  EXPECT_NE(got.details[1].find("numerics version"), std::string::npos)
      << got.details[1];
  // Turn 1 rewrote the checkpoint under `other`, so turn 2 (original
  // numerics) re-prefills again, and turn 3 reads its own rewrite.
  EXPECT_EQ(got.paths[2], StatePath::kReprefill);
  EXPECT_EQ(got.paths[3], StatePath::kRocksDb);
}

TEST_P(SessionEngineTest, UnknownOrForeignSessionIsNotFound) {
  const Variant v{"kv-direct", ops::ResidualKvSource::kAll};
  OpenStore();
  NewEngine(v, identity_);
  ASSERT_TRUE(engine_->CreateSession("acme", "chat-1", {}).ok());
  EXPECT_EQ(engine_->CreateSession("acme", "chat-1", {}).code(),
            absl::StatusCode::kAlreadyExists);
  TurnRequest r;
  r.tenant = "globex";  // another tenant, same session id
  r.session = "chat-1";
  r.tokens = TurnTokens(0);
  EXPECT_EQ(engine_->RunTurn(r, *tokenizer_, nullptr).status().code(),
            absl::StatusCode::kNotFound);
  r.tenant = "acme";
  r.session = "nope";
  EXPECT_EQ(engine_->RunTurn(r, *tokenizer_, nullptr).status().code(),
            absl::StatusCode::kNotFound);
  r.session = "../etc";
  EXPECT_EQ(engine_->RunTurn(r, *tokenizer_, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_P(SessionEngineTest, CancelledTurnCommitsNothing) {
  const Variant v{"kv-direct", 16};
  const Transcript reference = Converse(v, nullptr);
  FreshDir();
  OpenStore();
  NewEngine(v, identity_);
  ASSERT_TRUE(engine_->CreateSession("acme", "chat-1", {}).ok());
  Transcript t;
  ASSERT_TRUE(Turn(0, &t).ok());
  Transcript scratch;
  EXPECT_EQ(Turn(1, &scratch, /*cancel_after=*/3).status().code(),
            absl::StatusCode::kCancelled);
  EXPECT_EQ(engine_->stats().turns_failed, 1);
  for (int turn = 1; turn < kTurns; ++turn) ASSERT_TRUE(Turn(turn, &t).ok());
  ExpectSameBits(reference, t);
  EXPECT_EQ(t.paths[1], StatePath::kDram);  // the hot state was dropped
}

// A turn may start its session (HTTP and `kvd chat` do): nothing is stored
// until that turn commits, so a first turn that is cancelled leaves no empty
// session behind; a conversation started so is the one CreateSession starts,
// bit for bit, and its first turn reports the path "new" under every policy.
TEST_P(SessionEngineTest, TurnThatStartsASessionStoresItOnlyWhenItCommits) {
  for (const Variant& v : kVariants) {
    SCOPED_TRACE(v.policy + "/" + std::to_string(v.hot_budget));
    create_if_missing_ = false;
    const Transcript reference = Converse(v, nullptr);
    ASSERT_EQ(reference.paths.size(), static_cast<size_t>(kTurns));
    EXPECT_EQ(reference.paths[0], StatePath::kNew);

    FreshDir();
    OpenStore();
    NewEngine(v, identity_);
    create_if_missing_ = true;
    Transcript scratch;
    EXPECT_EQ(Turn(0, &scratch, /*cancel_after=*/3).status().code(),
              absl::StatusCode::kCancelled);
    EXPECT_EQ(engine_->GetSession("acme", "chat-1").status().code(),
              absl::StatusCode::kNotFound);
    EXPECT_EQ(store_->db().GetManifest("acme", "chat-1").status().code(),
              absl::StatusCode::kNotFound);

    Transcript t;
    for (int turn = 0; turn < kTurns; ++turn) {
      ASSERT_TRUE(Turn(turn, &t).ok()) << turn;
    }
    ExpectSameBits(reference, t);
    EXPECT_EQ(t.paths[0], StatePath::kNew);
    auto m = engine_->GetSession("acme", "chat-1");
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->turn_ends_size(), kTurns);
    EXPECT_EQ(m->policy(), v.policy);
    // Once stored, the session is found whatever the flag says.
    EXPECT_EQ(engine_->CreateSession("acme", "chat-1", {}).code(),
              absl::StatusCode::kAlreadyExists);
  }
  create_if_missing_ = false;
}

// While a first turn is starting a session (create_if_missing, held only in
// memory until it commits), CreateSession and ImportSession of the same name
// wait for it and then find the session; they must not report success and
// be overwritten by the turn's commit (or overwrite it).
TEST_P(SessionEngineTest, CreateOrImportDuringAStartingTurnFindsTheSession) {
  const Variant v{"kv-direct", ops::ResidualKvSource::kAll};
  for (const bool import : {false, true}) {
    SCOPED_TRACE(import ? "import" : "create");
    FreshDir();
    OpenStore();
    NewEngine(v, identity_);
    TurnRequest r = Request(0, 3);
    r.create_if_missing = true;
    Gate gate;
    HoldAtFirstStep(r, &gate);
    absl::Status turn;
    std::thread first(
        [&] { turn = engine_->RunTurn(r, *tokenizer_, nullptr).status(); });
    while (!gate.entered) absl::SleepFor(absl::Milliseconds(1));

    std::atomic<bool> returned{false};
    absl::Status other;
    std::thread second([&] {
      if (import) {
        storage::SessionCheckpoint cp;
        v1::SessionManifest manifest;
        manifest.set_format_version(storage::kCheckpointFormatVersion);
        manifest.set_tenant("acme");
        manifest.set_session_id("chat-1");
        *manifest.mutable_model() = identity_;
        manifest.set_policy("tokens");
        manifest.set_chunk_tokens(16);
        cp.Reset(manifest, {});
        other = engine_->ImportSession(cp);
      } else {
        other = engine_->CreateSession("acme", "chat-1", {});
      }
      returned = true;
    });
    absl::SleepFor(absl::Milliseconds(100));
    EXPECT_FALSE(returned) << "did not wait for the turn starting the session";
    gate.open = true;
    first.join();
    second.join();
    ASSERT_TRUE(turn.ok()) << turn;
    EXPECT_EQ(other.code(), absl::StatusCode::kAlreadyExists) << other;
    auto m = engine_->GetSession("acme", "chat-1");
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->turn_ends_size(), 1) << "the turn's commit was overwritten";
    EXPECT_EQ(m->policy(), "kv-direct");
  }
}

// A delete that ran while a turn was waiting for the same session must not
// drop that session's lock from the map: a later turn would get a fresh lock
// and run beside the waiting one. The holder's turn blocks; a delete and then
// a turn queue behind it; the delete (queued first) usually runs first, then
// the waiting turn starts the session again and blocks. A busy-checking turn
// must then find the session busy, not take a fresh lock.
TEST_P(SessionEngineTest, DeleteWhileATurnWaitsKeepsOneLockPerSession) {
  const Variant v{"kv-direct", ops::ResidualKvSource::kAll};
  OpenStore();
  NewEngine(v, identity_);
  auto turn = [&](Gate* gate) {
    TurnRequest r = Request(0, 2);
    r.create_if_missing = true;
    if (gate != nullptr) HoldAtFirstStep(r, gate);
    return r;
  };
  auto wait_for = [](const std::atomic<bool>& flag) {
    for (int i = 0; i < 30000 && !flag; ++i) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    return flag.load();
  };
  Gate holder_gate, waiter_gate;
  std::atomic<bool> deleted{false};
  std::thread holder([&] {
    EXPECT_TRUE(
        engine_->RunTurn(turn(&holder_gate), *tokenizer_, nullptr).ok());
  });
  ASSERT_TRUE(wait_for(holder_gate.entered));
  std::thread deleter([&] {
    EXPECT_TRUE(engine_->DeleteSession("acme", "chat-1").ok());
    deleted = true;
  });
  absl::SleepFor(absl::Milliseconds(50));
  std::thread waiter([&] {
    EXPECT_TRUE(
        engine_->RunTurn(turn(&waiter_gate), *tokenizer_, nullptr).ok());
  });
  absl::SleepFor(absl::Milliseconds(50));
  holder_gate.open = true;
  holder.join();
  ASSERT_TRUE(wait_for(waiter_gate.entered));
  if (deleted) {  // the order this test is about
    TurnRequest probe = turn(nullptr);
    probe.fail_if_busy = true;
    // Not starting the session: with a lock of its own the probe would
    // find nothing committed and fail NOT_FOUND at once, not wait for the
    // model that the blocked turn holds.
    probe.create_if_missing = false;
    EXPECT_EQ(engine_->RunTurn(probe, *tokenizer_, nullptr).status().code(),
              absl::StatusCode::kAborted)
        << "a turn ran beside the one holding the session";
  }
  waiter_gate.open = true;
  waiter.join();
  deleter.join();
}

INSTANTIATE_TEST_SUITE_P(Families, SessionEngineTest,
                         ::testing::ValuesIn(ops::testing::AllFamilyCases()),
                         ops::testing::FamilyCaseName);

}  // namespace
}  // namespace kvd::engine
