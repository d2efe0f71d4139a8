#include "storage/tiered/testing/sessions.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "storage/checkpoint/codec.h"

namespace kvd::storage::testing {
namespace {

std::string Payload(const std::string& seed, int64_t bytes) {
  std::string p(bytes, '\0');
  uint32_t h = 2166136261u;
  for (char c : seed) h = (h ^ static_cast<uint8_t>(c)) * 16777619u;
  for (auto& c : p) {
    h = h * 1664525u + 1013904223u;
    c = static_cast<char>(h >> 24);
  }
  return p;
}

}  // namespace

TurnUpdate MakeTurn(const std::string& tenant, const std::string& session,
                    int64_t tokens_before, int64_t tokens_after,
                    int64_t row_bytes) {
  const int64_t c = kTestChunkTokens;
  TurnUpdate t;
  v1::SessionManifest& m = t.manifest;
  m.set_format_version(kCheckpointFormatVersion);
  m.set_tenant(tenant);
  m.set_session_id(session);
  m.mutable_model()->set_fingerprint("00ff");
  m.mutable_model()->set_precision("fp32");
  m.set_policy("kv-direct");
  m.add_layers(0);
  m.add_first_position(0);
  m.set_chunk_tokens(c);
  m.set_dtype(v1::DTYPE_F32);
  m.set_row_bytes(row_bytes);
  m.set_token_count(tokens_after);
  m.set_length(tokens_after);
  m.add_turn_ends(tokens_after);
  m.set_stored_bytes(tokens_after * (row_bytes + 4));
  for (int64_t layer : {kTokenLayer, int64_t{0}}) {
    const int64_t rb = layer == kTokenLayer ? 4 : row_bytes;
    for (int64_t i = tokens_before / c; i * c < tokens_after; ++i) {
      v1::ChunkHeader h;
      h.set_layer(layer);
      h.set_chunk_index(i);
      h.set_first_position(i * c);
      h.set_rows(std::min(c, tokens_after - i * c));
      h.set_dtype(layer == kTokenLayer ? v1::DTYPE_I32 : v1::DTYPE_F32);
      h.set_row_bytes(rb);
      const std::string seed =
          absl::StrCat(tenant, "/", session, "/", layer, "/", i, "/", h.rows());
      t.put.emplace_back(ChunkId{layer, i},
                         EncodeChunk(h, Payload(seed, h.rows() * rb)));
    }
  }
  return t;
}

SessionCheckpoint Expected(std::initializer_list<TurnUpdate> turns) {
  SessionCheckpoint cp;
  for (const TurnUpdate& t : turns) cp.Apply(t).IgnoreError();
  return cp;
}

bool SameBytes(const SessionCheckpoint& a, const SessionCheckpoint& b) {
  return a.manifest().SerializeAsString() == b.manifest().SerializeAsString() &&
         a.chunks() == b.chunks();
}

absl::Status InMemoryLowerTierDouble::Store(const SessionCheckpoint& cp) {
  std::unique_lock<std::mutex> lock(mu_);
  ++stores_started_;
  changed_.notify_all();
  changed_.wait(lock, [this] { return !blocked_; });
  if (!failure_.ok()) return failure_;
  ++stores_;
  sessions_[{cp.manifest().tenant(), cp.manifest().session_id()}] = cp;
  return absl::OkStatus();
}

absl::StatusOr<SessionCheckpoint> InMemoryLowerTierDouble::Load(
    absl::string_view tenant, absl::string_view session,
    LoadObserver* observer) {
  SessionCheckpoint found;
  {
    std::unique_lock<std::mutex> lock(mu_);
    ++loads_;
    auto it = sessions_.find({std::string(tenant), std::string(session)});
    if (it == sessions_.end()) {
      return absl::NotFoundError(
          absl::StrCat("no session ", tenant, "/", session));
    }
    found = it->second;
  }
  if (observer != nullptr) ReplayLoad(found, observer);
  return found;
}

void InMemoryLowerTierDouble::BlockStores() {
  std::unique_lock<std::mutex> lock(mu_);
  blocked_ = true;
}

void InMemoryLowerTierDouble::UnblockStores() {
  std::unique_lock<std::mutex> lock(mu_);
  blocked_ = false;
  changed_.notify_all();
}

bool InMemoryLowerTierDouble::AwaitStoresStarted(int n) {
  std::unique_lock<std::mutex> lock(mu_);
  return changed_.wait_for(lock, std::chrono::seconds(10),
                           [this, n] { return stores_started_ >= n; });
}

void InMemoryLowerTierDouble::FailStores(absl::Status status) {
  std::unique_lock<std::mutex> lock(mu_);
  failure_ = std::move(status);
}

bool InMemoryLowerTierDouble::Has(const std::string& tenant,
                                  const std::string& session) {
  std::unique_lock<std::mutex> lock(mu_);
  return sessions_.count({tenant, session}) > 0;
}

int InMemoryLowerTierDouble::stores() const {
  std::unique_lock<std::mutex> lock(mu_);
  return stores_;
}

int InMemoryLowerTierDouble::loads() const {
  std::unique_lock<std::mutex> lock(mu_);
  return loads_;
}

absl::Status MoveSessionForTest(TieredStore& store, const std::string& tenant,
                                const std::string& session,
                                const std::string& owner, uint64_t epoch) {
  absl::StatusOr<v1::SessionManifest> m = store.GetManifest(tenant, session);
  if (!m.ok()) return m.status();
  TurnUpdate move;
  move.manifest = *std::move(m);
  move.manifest.set_owner_node(owner);
  move.manifest.set_epoch(epoch);
  move.ownership_change = true;
  return store.CommitTurn(move);
}

}  // namespace kvd::storage::testing
