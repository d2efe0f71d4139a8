#include "services/cluster/directory.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace kvd::cluster {
namespace {

using nlohmann::json;

std::string Encode(const DirectoryEntry& e) {
  return json{{"owner", e.owner},
              {"epoch", e.epoch},
              {"replicas", e.replicas},
              {"state", e.state}}
      .dump();
}

}  // namespace

absl::StatusOr<DirectoryEntry> DecodeDirectoryEntry(const EtcdKeyValue& kv) {
  const json j = json::parse(kv.value, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("owner") || !j["owner"].is_string() ||
      !j.contains("epoch") || !j["epoch"].is_number_unsigned()) {
    return absl::DataLossError(absl::StrCat(
        "directory entry ", kv.key,
        " does not parse as a session entry: ", kv.value.substr(0, 200)));
  }
  DirectoryEntry e;
  e.owner = j["owner"].get<std::string>();
  e.epoch = j["epoch"].get<uint64_t>();
  if (j.contains("replicas") && j["replicas"].is_array()) {
    for (const json& r : j["replicas"]) {
      if (r.is_string()) e.replicas.push_back(r.get<std::string>());
    }
  }
  if (j.contains("state") && j["state"].is_string()) {
    e.state = j["state"].get<std::string>();
  }
  e.mod_revision = kv.mod_revision;
  return e;
}

std::string SessionDirectory::Key(const std::string& tenant,
                                  const std::string& session) {
  return absl::StrCat(kSessionsPrefix, tenant, "/", session);
}

absl::StatusOr<std::optional<DirectoryEntry>> SessionDirectory::Lookup(
    const std::string& tenant, const std::string& session) {
  absl::StatusOr<std::optional<EtcdKeyValue>> kv =
      etcd_->Get(Key(tenant, session));
  if (!kv.ok()) return kv.status();
  if (!kv->has_value()) return std::optional<DirectoryEntry>();
  absl::StatusOr<DirectoryEntry> e = DecodeDirectoryEntry(**kv);
  if (!e.ok()) return e.status();
  return std::optional<DirectoryEntry>(*std::move(e));
}

absl::StatusOr<DirectoryEntry> SessionDirectory::Create(
    const std::string& tenant, const std::string& session,
    const std::string& owner) {
  DirectoryEntry e;
  e.owner = owner;
  e.epoch = 1;
  const std::string key = Key(tenant, session);
  absl::StatusOr<bool> won = etcd_->PutIfModRevision(key, Encode(e), 0);
  if (!won.ok()) return won.status();
  if (!*won) {
    return absl::AlreadyExistsError(absl::StrCat(
        "session '", session, "' of tenant '", tenant,
        "' is in the directory already (placed by someone else first)"));
  }
  absl::StatusOr<std::optional<DirectoryEntry>> placed =
      Lookup(tenant, session);
  if (!placed.ok()) return placed.status();
  if (!placed->has_value()) {
    return absl::AbortedError(
        absl::StrCat("session '", session,
                     "' left the directory right after it was "
                     "placed; look it up again"));
  }
  return **placed;
}

absl::StatusOr<DirectoryEntry> SessionDirectory::Replace(
    const std::string& tenant, const std::string& session,
    const DirectoryEntry& expected, const DirectoryEntry& next) {
  absl::StatusOr<bool> won = etcd_->PutIfModRevision(
      Key(tenant, session), Encode(next), expected.mod_revision);
  if (!won.ok()) return won.status();
  if (!*won) {
    return absl::AbortedError(
        absl::StrCat("session '", session, "' of tenant '", tenant,
                     "' changed in the directory since it was read (epoch ",
                     expected.epoch, "); look it up again and decide"));
  }
  absl::StatusOr<std::optional<DirectoryEntry>> now = Lookup(tenant, session);
  if (!now.ok()) return now.status();
  if (!now->has_value()) {
    return absl::AbortedError("the session left the directory meanwhile");
  }
  return **now;
}

absl::StatusOr<DirectoryEntry> SessionDirectory::Move(
    const std::string& tenant, const std::string& session,
    const DirectoryEntry& expected, const std::string& to) {
  DirectoryEntry next = expected;
  next.owner = to;
  next.epoch = expected.epoch + 1;
  next.state = "active";
  // Replicas hold copies of the old owner's epoch: the new owner chooses
  // (and fills) its own.
  next.replicas.clear();
  return Replace(tenant, session, expected, next);
}

absl::StatusOr<DirectoryEntry> SessionDirectory::SetReplicas(
    const std::string& tenant, const std::string& session,
    const DirectoryEntry& expected, std::vector<std::string> replicas) {
  DirectoryEntry next = expected;
  next.replicas = std::move(replicas);
  return Replace(tenant, session, expected, next);
}

absl::Status SessionDirectory::Remove(const std::string& tenant,
                                      const std::string& session,
                                      const DirectoryEntry& expected) {
  absl::StatusOr<bool> won =
      etcd_->DeleteIfModRevision(Key(tenant, session), expected.mod_revision);
  if (!won.ok()) return won.status();
  if (!*won) {
    return absl::AbortedError(absl::StrCat(
        "session '", session, "' of tenant '", tenant,
        "' changed in the directory since it was read; not removed"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::pair<std::string, DirectoryEntry>>>
SessionDirectory::List(const std::string& tenant) {
  const std::string prefix = absl::StrCat(kSessionsPrefix, tenant, "/");
  absl::StatusOr<std::vector<EtcdKeyValue>> kvs = etcd_->GetPrefix(prefix);
  if (!kvs.ok()) return kvs.status();
  std::vector<std::pair<std::string, DirectoryEntry>> out;
  for (const EtcdKeyValue& kv : *kvs) {
    absl::StatusOr<DirectoryEntry> e = DecodeDirectoryEntry(kv);
    if (!e.ok()) continue;  // reported when that session is looked up
    out.emplace_back(kv.key.substr(prefix.size()), *std::move(e));
  }
  return out;
}

absl::StatusOr<std::vector<SessionDirectory::OwnedSession>>
SessionDirectory::ListOwnedBy(const std::string& owner) {
  return ListWhere(
      [&owner](const DirectoryEntry& e) { return e.owner == owner; });
}

absl::StatusOr<std::vector<SessionDirectory::OwnedSession>>
SessionDirectory::ListHeldBy(const std::string& node) {
  return ListWhere([&node](const DirectoryEntry& e) {
    return e.owner == node || std::find(e.replicas.begin(), e.replicas.end(),
                                        node) != e.replicas.end();
  });
}

absl::StatusOr<std::vector<SessionDirectory::OwnedSession>>
SessionDirectory::ListWhere(
    const std::function<bool(const DirectoryEntry&)>& keep) {
  absl::StatusOr<std::vector<EtcdKeyValue>> kvs =
      etcd_->GetPrefix(kSessionsPrefix);
  if (!kvs.ok()) return kvs.status();
  std::vector<OwnedSession> out;
  const size_t prefix = std::string(kSessionsPrefix).size();
  for (const EtcdKeyValue& kv : *kvs) {
    absl::StatusOr<DirectoryEntry> e = DecodeDirectoryEntry(kv);
    if (!e.ok() || !keep(*e)) continue;
    const std::string rest = kv.key.substr(prefix);
    const size_t slash = rest.find('/');
    if (slash == std::string::npos) continue;
    out.push_back(
        {rest.substr(0, slash), rest.substr(slash + 1), *std::move(e)});
  }
  return out;
}

}  // namespace kvd::cluster
