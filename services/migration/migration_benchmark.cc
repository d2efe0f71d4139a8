// Moving a session of 1k, 4k and 8k tokens between two nodes:
// SmolLM2-135M, two engines in one process, each with its own RocksDB +
// DRAM store, a real etcd directory, the kvd.v1.Migration gRPC service and
// UCX (TCP by default) on loopback. For each size it reports, side by side:
//   - the move: bytes on the wire, the pause (frozen until the target owns
//     the session), the whole move;
//   - the first token on the target after the move (rebuilding K/V from the
//     residuals received), and so freeze -> first token on the target;
//   - shipping plain K/V instead: the same data plane carrying the K/V's
//     bytes (transfer only: writing them into cache blocks is not counted,
//     so this favours it);
//   - re-prefilling the whole conversation on the target (what a stateless
//     server does).
// Prints a Markdown table; nothing is asserted.
//
//   bazel run -c opt //services/migration:migration_benchmark --
//       [--precision bf16|fp32] [--ucx-tls tcp|sm] [--sizes 1024,4096,8000]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "base/model_dir.h"
#include "grpcpp/grpcpp.h"
#include "ops/model/model.h"
#include "ops/tokenizer/gguf_tokenizer.h"
#include "services/cluster/directory.h"
#include "services/cluster/testing/etcd_process.h"
#include "services/engine/session_engine.h"
#include "services/migration/inbound.h"
#include "services/migration/migration_service.h"
#include "services/migration/migrator.h"
#include "services/migration/testing/directory_fence_for_test.h"
#include "services/migration/testing/served_migration.h"
#include "services/transport/secure_stream.h"
#include "services/transport/ucx_transport.h"
#include "storage/rocksdb/session_db.h"
#include "storage/tiered/tiered_store.h"

namespace kvd::migration {
namespace {

constexpr char kModelFile[] = "SmolLM2-135M-Instruct.Q4_1.gguf";
constexpr char kToken[] = "benchmark-cluster-token";

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

struct BenchNode {
  std::unique_ptr<storage::TieredStore> store;
  std::unique_ptr<engine::SessionEngine> engine;
  std::unique_ptr<testing::ServedMigration> migration;
};

absl::StatusOr<std::unique_ptr<BenchNode>> StartNode(
    const std::string& id, const std::string& dir, const ops::Model& model,
    const v1::ModelIdentity& identity, cluster::SessionDirectory* directory,
    transport::Transport* plane) {
  auto n = std::make_unique<BenchNode>();
  storage::SessionDbOptions so;
  so.path = dir;
  so.durability = storage::Durability::kWal;  // the disk is not measured
  absl::StatusOr<std::unique_ptr<storage::SessionDb>> db =
      storage::SessionDb::Open(so);
  if (!db.ok()) return db.status();
  storage::TieredStoreOptions to;
  to.dram.budget_bytes = int64_t{2} << 30;  // sessions stay in DRAM
  absl::StatusOr<std::unique_ptr<storage::TieredStore>> store =
      storage::TieredStore::Create(std::move(*db), to);
  if (!store.ok()) return store.status();
  n->store = std::move(*store);
  engine::SessionEngineOptions o;
  o.node_id = id;
  o.fence = std::make_shared<testing::DirectoryFenceForTest>(directory, id);
  o.kv_pool_bytes = int64_t{1} << 30;
  n->engine = std::make_unique<engine::SessionEngine>(model, identity,
                                                      n->store.get(), o);
  n->migration =
      testing::ServeMigration(n->engine.get(), plane, InboundOptions(), kToken,
                              /*max_message_bytes=*/64 << 20);
  return n;
}

// One turn; the time to its first generated token (max_tokens = 1).
absl::StatusOr<double> TurnMs(engine::SessionEngine& engine,
                              const ops::Tokenizer& tok,
                              const std::string& session,
                              std::vector<int32_t> tokens) {
  engine::TurnRequest r;
  r.tenant = "bench";
  r.session = session;
  r.tokens = std::move(tokens);
  r.create_if_missing = true;
  r.generate.max_tokens = 1;
  r.generate.ignore_eos = true;
  r.generate.sampling.temperature = 0;
  const absl::Time start = absl::Now();
  absl::StatusOr<engine::TurnResult> res = engine.RunTurn(r, tok, nullptr);
  if (!res.ok()) return res.status();
  return Ms(absl::Now() - start);
}

// Sends `bytes` over a fresh secure stream of `plane`; its time in ms.
absl::StatusOr<double> ShipMs(transport::Transport& plane, int64_t bytes) {
  absl::StatusOr<std::unique_ptr<transport::ChunkReceiver>> inner =
      plane.Listen({.max_chunk_bytes = 2 << 20});
  if (!inner.ok()) return inner.status();
  const transport::TransferSecret secret = transport::TransferSecret::New();
  transport::SecureReceiver in(std::move(*inner), secret);
  const std::string address = in.address();
  absl::Status sent;
  const absl::Time start = absl::Now();
  std::thread sender([&] {
    absl::StatusOr<std::unique_ptr<transport::ChunkSender>> out =
        plane.Connect(address);
    if (!out.ok()) {
      sent = out.status();
      return;
    }
    auto secure = transport::SecureSender::Start(std::move(*out), secret);
    if (!secure.ok()) {
      sent = secure.status();
      return;
    }
    const std::string piece(1 << 20, 'k');
    for (int64_t left = bytes; left > 0 && sent.ok();
         left -= static_cast<int64_t>(piece.size())) {
      sent = (*secure)->Send(absl::string_view(piece).substr(
          0, std::min<int64_t>(left, piece.size())));
    }
    if (sent.ok()) sent = (*secure)->Finish();
  });
  std::string chunk;
  absl::Status got;
  for (;;) {
    absl::StatusOr<bool> more =
        in.Receive(&chunk, absl::Now() + absl::Seconds(60));
    if (!more.ok()) {
      got = more.status();
      break;
    }
    if (!*more) break;
  }
  sender.join();
  if (!sent.ok()) return sent;
  if (!got.ok()) return got;
  return Ms(absl::Now() - start);
}

int Main(int argc, char** argv) {
  std::string precision = "bf16", tls = "tcp";
  std::vector<int64_t> sizes = {1024, 4096, 8000};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--precision") {
      precision = value;
    } else if (flag == "--ucx-tls") {
      tls = value;
    } else if (flag == "--sizes") {
      sizes.clear();
      for (absl::string_view s : absl::StrSplit(value, ',')) {
        int64_t n = 0;
        if (!absl::SimpleAtoi(s, &n) || n < 1) {
          std::fprintf(stderr, "bad --sizes\n");
          return 2;
        }
        sizes.push_back(n);
      }
    } else {
      std::fprintf(stderr,
                   "usage: migration_benchmark [--precision bf16|fp32] "
                   "[--ucx-tls tcp|sm] [--sizes 1024,4096,8000]\n");
      return 2;
    }
  }
  ops::LoadOptions load;
  load.precision =
      precision == "fp32" ? ops::Precision::kF32 : ops::Precision::kBf16;
  absl::StatusOr<std::unique_ptr<ops::Model>> model =
      ops::Model::Load(CachedModelPath(kModelFile), load);
  if (!model.ok()) {
    std::fprintf(stderr, "%s (run tools/fetch_models.sh)\n",
                 model.status().ToString().c_str());
    return 1;
  }
  absl::StatusOr<std::unique_ptr<ops::Tokenizer>> tok =
      ops::TokenizerFromGguf((*model)->file());
  if (!tok.ok()) return 1;
  const v1::ModelIdentity identity =
      engine::ModelIdentityOf(**model, "sha256:migration-benchmark");
  const char* tmp_env = std::getenv("TMPDIR");
  const std::string tmp = absl::StrCat(tmp_env ? tmp_env : "/tmp",
                                       "/kvd-migration-bench-", getpid());
  auto etcd = cluster::testing::EtcdProcess::Start(tmp);
  if (!etcd.ok()) {
    std::fprintf(stderr, "%s (tools/setup.sh --test installs etcd)\n",
                 etcd.status().ToString().c_str());
    return 1;
  }
  auto client = cluster::EtcdClient::Connect({.endpoint = (*etcd)->endpoint()});
  if (!client.ok()) return 1;
  cluster::SessionDirectory directory(client->get());
  auto ucx = transport::UcxTransport::Create({.tls = tls});
  if (!ucx.ok()) {
    std::fprintf(stderr, "%s\n", ucx.status().ToString().c_str());
    return 1;
  }
  auto a =
      StartNode("a", tmp + "/a", **model, identity, &directory, ucx->get());
  auto b =
      StartNode("b", tmp + "/b", **model, identity, &directory, ucx->get());
  if (!a.ok() || !b.ok()) {
    std::fprintf(stderr, "cannot start the nodes\n");
    return 1;
  }
  PeerResolver resolve =
      [&](const std::string& id) -> absl::StatusOr<PeerNode> {
    return PeerNode{
        id == "b" ? (*b)->migration->address : (*a)->migration->address,
        identity.fingerprint()};
  };
  Migrator from_a((*a)->engine.get(), &directory, ucx->get(), resolve,
                  {.node_id = "a", .cluster_token = kToken});
  const ops::ModelConfig& c = (*model)->config();
  const int64_t elem = precision == "fp32" ? 4 : 2;
  std::printf(
      "SmolLM2-135M %s, %s, UCX %s on loopback, %d threads\n\n"
      "| tokens | moved bytes (wire) | pause ms | move ms | first token on "
      "target ms | freeze -> first token ms | K/V bytes | ship K/V ms "
      "(transfer only) | re-prefill on target ms |\n"
      "|---|---|---|---|---|---|---|---|---|\n",
      precision.c_str(), identity.fingerprint().substr(0, 16).c_str(),
      tls.c_str(), (*model)->pool()->num_threads());
  std::mt19937 rng(42);
  for (int64_t n : sizes) {
    std::vector<int32_t> prompt(n), next(16);
    for (auto& t : prompt) t = rng() % c.vocab_size;
    for (auto& t : next) t = rng() % c.vocab_size;
    const std::string s = absl::StrCat("s", n);
    if (!directory.Create("bench", s, "a").ok()) return 1;
    absl::StatusOr<double> made = TurnMs(*(*a)->engine, **tok, s, prompt);
    if (!made.ok()) {
      std::fprintf(stderr, "%s\n", made.status().ToString().c_str());
      return 1;
    }
    absl::StatusOr<MigrationReport> r = from_a.Migrate("bench", s, "b");
    if (!r.ok()) {
      std::fprintf(stderr, "%s\n", r.status().ToString().c_str());
      return 1;
    }
    absl::StatusOr<double> first = TurnMs(*(*b)->engine, **tok, s, next);
    // What a stateless server does on the target: the whole conversation
    // (the prompt, the reply token, the new message) through the model.
    const std::string fresh = absl::StrCat("p", n);
    if (!directory.Create("bench", fresh, "b").ok()) return 1;
    std::vector<int32_t> all = prompt;
    all.push_back(0);
    all.insert(all.end(), next.begin(), next.end());
    absl::StatusOr<double> prefill = TurnMs(*(*b)->engine, **tok, fresh, all);
    const int64_t kv_bytes = (n + 1) * c.n_layers * 2 * c.kv_dim() * elem;
    absl::StatusOr<double> ship = ShipMs(**ucx, kv_bytes);
    if (!first.ok() || !prefill.ok() || !ship.ok()) {
      std::fprintf(stderr, "a step failed\n");
      return 1;
    }
    std::printf(
        "| %lld | %.1f MB | %.1f | %.1f | %.1f | %.1f | %.1f MB | %.1f "
        "| %.1f |\n",
        static_cast<long long>(n), r->wire_bytes / 1e6, Ms(r->pause),
        Ms(r->total), *first, Ms(r->pause) + *first, kv_bytes / 1e6, *ship,
        *prefill);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace kvd::migration

int main(int argc, char** argv) { return kvd::migration::Main(argc, argv); }
