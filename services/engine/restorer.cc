#include "services/engine/restorer.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "ops/kvdirect/residual_store.h"
#include "services/engine/session_chunks.h"
#include "storage/checkpoint/codec.h"
#include "storage/checkpoint/ownership.h"

namespace kvd::engine {
namespace {

// Tokens per forward step of a re-prefill: bounds its activations.
constexpr int64_t kReprefillBlock = 256;

}  // namespace

const char* StatePathName(StatePath path) {
  switch (path) {
    case StatePath::kNew:
      return "new";
    case StatePath::kHot:
      return "hot";
    case StatePath::kDram:
      return "dram";
    case StatePath::kRocksDb:
      return "rocksdb";
    case StatePath::kReprefill:
      return "reprefill";
  }
  return "unknown";
}

std::shared_ptr<SessionRecord> Restorer::NewRecord(
    const ops::CheckpointPolicy& policy) const {
  return std::make_shared<SessionRecord>(*parts_.model, parts_.pool, policy,
                                         parts_.hot_budget);
}

absl::StatusOr<std::shared_ptr<SessionRecord>> Restorer::Restore(
    const std::string& tenant, const std::string& session,
    bool create_if_missing, RestoreOutcome* outcome) {
  StreamedLoad load(parts_.store, tenant, session);
  absl::StatusOr<std::shared_ptr<SessionRecord>> streamed = nullptr;
  if (const v1::SessionManifest* m = load.WaitManifest(); m != nullptr) {
    streamed = RestoreStreamed(*m, load);
  }
  absl::StatusOr<storage::TieredStore::Loaded> loaded = load.Finish();
  if (streamed.ok() && *streamed != nullptr && loaded.ok() &&
      loaded->observed) {
    outcome->path = StatePath::kRocksDb;
    outcome->streamed = true;
    return streamed;
  }
  // A damaged chunk: the whole-checkpoint path below falls back to the
  // token ids and says why. Other errors are what it would have met too.
  if (!streamed.ok() && streamed.status().code() != absl::StatusCode::kDataLoss)
    return streamed.status();
  // Not streamed, or the session changed while it was read (then what was
  // rebuilt is stale): the whole checkpoint decides.
  streamed = nullptr;
  std::shared_ptr<const storage::SessionCheckpoint> checkpoint;
  storage::Tier tier = storage::Tier::kRocksDb;
  std::string fallback;  // why the residuals cannot be used, if they cannot
  bool other_numerics = false;  // fallback: the checkpoint's numerics differ
  if (loaded.ok()) {
    checkpoint = loaded->checkpoint;
    tier = loaded->tier;
  } else if (loaded.status().code() == absl::StatusCode::kNotFound &&
             create_if_missing) {
    // Started by this turn: held in memory only until the turn commits.
    KVD_ASSIGN_OR_RETURN(
        v1::SessionManifest m,
        NewSessionManifest(*parts_.model, *parts_.identity, parts_.defaults,
                           tenant, session, {}));
    auto fresh = std::make_shared<storage::SessionCheckpoint>();
    fresh->Reset(std::move(m), {});
    checkpoint = std::move(fresh);
  } else {
    if (loaded.status().code() == absl::StatusCode::kNotFound) {
      return absl::NotFoundError(absl::StrCat(
          SessionName(tenant, session),
          " not found; create it first (gRPC CreateSession; over HTTP a chat "
          "request with this session_id starts it)"));
    }
    if (loaded.status().code() != absl::StatusCode::kDataLoss)
      return loaded.status();
    fallback = std::string(loaded.status().message());
    absl::StatusOr<storage::SessionCheckpoint> tokens_only =
        parts_.store->db().Load(tenant, session,
                                storage::SessionDb::Parts::kManifestAndTokens);
    if (!tokens_only.ok()) {
      return absl::DataLossError(absl::StrCat(
          SessionName(tenant, session),
          " cannot be restored: its residual checkpoint is damaged (", fallback,
          ") and so are its token ids (", tokens_only.status().message(), ")"));
    }
    checkpoint = std::make_shared<const storage::SessionCheckpoint>(
        std::move(*tokens_only));
  }
  const v1::SessionManifest& m = checkpoint->manifest();
  KVD_RETURN_IF_ERROR(CheckNodeMayCommit(m, parts_.defaults.node_id));
  KVD_RETURN_IF_ERROR(
      storage::CheckCompatible(m.model(), *parts_.identity, session));
  if (absl::Status same = storage::SameNumerics(m.model(), *parts_.identity);
      !same.ok() && fallback.empty()) {
    // Residuals from another backend or kernel build: the tokens are good,
    // so the session continues from a re-prefill on this node's numerics.
    fallback = std::string(same.message());
    other_numerics = true;
  }
  KVD_ASSIGN_OR_RETURN(ops::CheckpointPolicy policy,
                       ops::ParseCheckpointPolicy(m.policy()));
  auto record = NewRecord(policy);
  record->committed = m;
  KVD_RETURN_IF_ERROR(RestoreTokens(*checkpoint, &record->tokens));
  outcome->path = m.token_count() == 0           ? StatePath::kNew
                  : tier == storage::Tier::kDram ? StatePath::kDram
                                                 : StatePath::kRocksDb;
  if (m.token_count() > 0 && m.length() == 0 &&
      policy.kind != ops::CheckpointPolicy::Kind::kTokens) {
    // Stored without residual rows (salvaged: storage::TokensOnly): the
    // turn runs every stored token through the model and stores them anew.
    outcome->path = StatePath::kReprefill;
    outcome->detail =
        "stored without its residual checkpoint (salvaged from a damaged "
        "database): its tokens run through the model again";
  }
  if (fallback.empty() && policy.kind == ops::CheckpointPolicy::Kind::kKv) {
    // The K/V themselves: copied into the cache, nothing to compute.
    absl::Status restored = parts_.model->KvRowAccess();
    if (restored.ok()) {
      do {  // a full pool: idle sessions make room first
        restored = RestoreKv(*checkpoint, *parts_.model, &record->cache);
      } while (restored.code() == absl::StatusCode::kResourceExhausted &&
               parts_.hot->DemoteOneIdle());
      if (restored.ok()) return record;
      if (restored.code() != absl::StatusCode::kDataLoss &&
          restored.code() != absl::StatusCode::kUnimplemented) {
        return restored;
      }
    }
    record->cache.Reset(0);
    fallback = std::string(restored.message());
  } else if (fallback.empty() &&
             policy.kind != ops::CheckpointPolicy::Kind::kTokens &&
             policy.kind != ops::CheckpointPolicy::Kind::kKv) {
    const absl::Status restored =
        RestoreResiduals(*checkpoint, &record->store, 0);
    if (restored.ok()) {
      ops::RebuildSpec spec;
      spec.policy = policy;
      spec.tokens = absl::MakeConstSpan(record->tokens).first(m.length());
      spec.checkpoint = &record->store;
      spec.budget = record->budget();
      KVD_RETURN_IF_ERROR(Rebuild(spec, *record));
      return record;
    }
    if (restored.code() != absl::StatusCode::kDataLoss) return restored;
    fallback = std::string(restored.message());
  }
  // Token ids only: the policy keeps nothing else, or the rest is damaged.
  if (m.token_count() == 0 && fallback.empty()) return record;  // new
  outcome->path = StatePath::kReprefill;
  outcome->detail =
      fallback.empty()
          ? absl::StrCat("policy ", m.policy(), " stores token ids only")
          : absl::StrCat(other_numerics ? "checkpoint from other numerics: "
                                        : "stored checkpoint rejected: ",
                         fallback);
  if (!fallback.empty()) {
    record->rewrite_all = true;
    record->store.Erase(0);
  }
  KVD_RETURN_IF_ERROR(Reprefill(*record));
  return record;
}

absl::StatusOr<std::shared_ptr<SessionRecord>> Restorer::RestoreStreamed(
    const v1::SessionManifest& m, StreamedLoad& load) {
  // Only the plain case streams: residual rows of this node's numerics that
  // it may commit to. Anything else goes the whole-checkpoint way (null),
  // which knows the fallbacks and says why.
  absl::StatusOr<ops::CheckpointPolicy> policy =
      ops::ParseCheckpointPolicy(m.policy());
  if (!policy.ok() ||
      (policy->kind != ops::CheckpointPolicy::Kind::kKvDirect &&
       policy->kind != ops::CheckpointPolicy::Kind::kStride) ||
      m.token_count() == 0 || m.length() == 0 ||
      !CheckNodeMayCommit(m, parts_.defaults.node_id).ok() ||
      !storage::CheckCompatible(m.model(), *parts_.identity, m.session_id())
           .ok() ||
      !storage::SameNumerics(m.model(), *parts_.identity).ok()) {
    return nullptr;
  }
  auto record = NewRecord(*policy);
  record->committed = m;
  KVD_ASSIGN_OR_RETURN(const StreamedLoad::Chunks* tokens,
                       load.WaitStream(storage::kTokenLayer));
  KVD_RETURN_IF_ERROR(RestoreTokens(m, *tokens, &record->tokens));
  ops::RebuildSpec spec;
  spec.policy = *policy;
  spec.tokens = absl::MakeConstSpan(record->tokens).first(m.length());
  spec.checkpoint = &record->store;
  spec.budget = record->budget();
  int64_t restored_through = -1;  // a retried rebuild asks again
  KVD_RETURN_IF_ERROR(
      Rebuild(spec, *record, [&](Scheduler::RestoreContext& context) {
        spec.await_layer = [&](int64_t layer) -> absl::Status {
          if (layer <= restored_through) return absl::OkStatus();
          // Waiting for the disk needs no model: running sequences go on.
          while (!load.Arrived(layer)) context.Idle(absl::Milliseconds(1));
          absl::StatusOr<const StreamedLoad::Chunks*> stream =
              load.WaitStream(layer);
          KVD_RETURN_IF_ERROR(stream.status());
          KVD_RETURN_IF_ERROR(
              RestoreResidualLayer(m, **stream, layer, &record->store, 0));
          restored_through = layer;
          return absl::OkStatus();
        };
      }));
  return record;
}

absl::Status Restorer::Rebuild(
    ops::RebuildSpec& spec, SessionRecord& record,
    const std::function<void(Scheduler::RestoreContext&)>& prepare) {
  return parts_.scheduler->RunRestore([&](Scheduler::RestoreContext& context) {
    spec.between_units = [&](const ops::RebuildUnit& unit) {
      context.BeforeUnit(unit.PromptTokens(parts_.model->config()));
    };
    if (prepare) prepare(context);
    absl::Status rebuilt;
    do {  // a full pool: idle sessions make room first
      rebuilt =
          ops::RebuildKv(*parts_.model, spec, &record.cache, /*cold=*/nullptr);
    } while (rebuilt.code() == absl::StatusCode::kResourceExhausted &&
             parts_.hot->DemoteOneIdle());
    return rebuilt;
  });
}

absl::Status Restorer::Reprefill(SessionRecord& record) {
  return parts_.scheduler->RunRestore([&](Scheduler::RestoreContext& context) {
    absl::Status status = ReprefillOnce(record, context);
    // A full pool: idle sessions make room, as for RebuildKv. The failed
    // attempt may have filled part of the cache and shown the observer a
    // prefix of residuals, so each retry starts from nothing.
    while (status.code() == absl::StatusCode::kResourceExhausted &&
           parts_.hot->DemoteOneIdle()) {
      record.cache.Reset(0);
      record.store.Erase(0);
      status = ReprefillOnce(record, context);
    }
    return status;
  });
}

absl::Status Restorer::ReprefillOnce(SessionRecord& record,
                                     Scheduler::RestoreContext& context) {
  const int64_t length = record.committed.length();
  ops::ForwardOutput out;
  for (int64_t at = 0; at < length; at += kReprefillBlock) {
    const int64_t n = std::min(kReprefillBlock, length - at);
    // Prompt tokens in full: the budget's own unit.
    if (at > 0) context.BeforeUnit(n);
    ops::SequenceStep step{&record.cache,
                           absl::MakeConstSpan(record.tokens).subspan(at, n),
                           ops::LogitsMode::kNone, 0, record.source.get()};
    KVD_RETURN_IF_ERROR(parts_.model->Forward({&step, 1}, &out, &record.store));
  }
  return record.store.status();
}

}  // namespace kvd::engine
