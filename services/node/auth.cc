#include "services/node/auth.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/status_macros.h"
#include "services/node/peer_identity.h"
#include "storage/checkpoint/codec.h"

namespace kvd::node {

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  // Walk the longer string in full so the time depends only on lengths.
  const size_t n = std::max(a.size(), b.size());
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? a[i] : 0;
    const unsigned char y = i < b.size() ? b[i] : 0;
    diff |= x ^ y;
  }
  return diff == 0;
}

absl::Status KeyStore::Add(std::string key, std::string tenant,
                           absl::string_view where) {
  if (key.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": empty API key; write '<key> <tenant>'"));
  }
  absl::Status name = storage::ValidateName("tenant", tenant);
  if (!name.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": ", name.message()));
  }
  for (const Entry& e : entries_) {
    if (e.key == key) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": API key given twice (tenants '", e.tenant, "' and '",
          tenant, "'); each key must belong to exactly one tenant"));
    }
  }
  entries_.push_back(Entry{std::move(key), std::move(tenant)});
  return absl::OkStatus();
}

absl::StatusOr<KeyStore> KeyStore::FromPairs(
    std::vector<std::pair<std::string, std::string>> entries) {
  KeyStore store;
  for (size_t i = 0; i < entries.size(); ++i) {
    KVD_RETURN_IF_ERROR(store.Add(std::move(entries[i].first),
                                  std::move(entries[i].second),
                                  absl::StrCat("API key entry ", i)));
  }
  return store;
}

namespace {

absl::Status AddFile(const std::string& path,
                     std::vector<std::pair<std::string, std::string>>* out) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(
        "cannot open API key file ", path,
        "; create it with lines '<key> <tenant>' or unset the flag"));
  }
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    absl::string_view text = line;
    if (size_t hash = text.find('#'); hash != absl::string_view::npos) {
      text = text.substr(0, hash);
    }
    text = absl::StripAsciiWhitespace(text);
    if (text.empty()) continue;
    std::vector<absl::string_view> fields =
        absl::StrSplit(text, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (fields.size() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", line_no, ": expected '<key> <tenant>', got ",
                       fields.size(), " fields"));
    }
    out->emplace_back(std::string(fields[0]), std::string(fields[1]));
  }
  return absl::OkStatus();
}

absl::Status AddEnvValue(
    absl::string_view value,
    std::vector<std::pair<std::string, std::string>>* out) {
  for (absl::string_view item : absl::StrSplit(value, ',', absl::SkipEmpty())) {
    item = absl::StripAsciiWhitespace(item);
    if (item.empty()) continue;
    // Split at the last ':' so keys may contain ':' (tenant names cannot).
    const size_t colon = item.rfind(':');
    if (colon == absl::string_view::npos || colon == 0 ||
        colon + 1 == item.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(kApiKeysEnv,
                       ": expected 'key1:tenant1,key2:tenant2', got an entry "
                       "without a key or tenant (",
                       item.size(), " bytes)"));
    }
    out->emplace_back(std::string(item.substr(0, colon)),
                      std::string(item.substr(colon + 1)));
  }
  return absl::OkStatus();
}

absl::StatusOr<KeyStore> Build(
    std::vector<std::pair<std::string, std::string>> entries,
    absl::string_view source) {
  absl::StatusOr<KeyStore> built = KeyStore::FromPairs(std::move(entries));
  if (!built.ok()) {
    return absl::Status(built.status().code(),
                        absl::StrCat(source, ": ", built.status().message()));
  }
  return built;
}

}  // namespace

absl::StatusOr<KeyStore> KeyStore::FromFile(const std::string& path) {
  std::vector<std::pair<std::string, std::string>> entries;
  KVD_RETURN_IF_ERROR(AddFile(path, &entries));
  return Build(std::move(entries), path);
}

absl::StatusOr<KeyStore> KeyStore::FromEnvValue(absl::string_view value) {
  std::vector<std::pair<std::string, std::string>> entries;
  KVD_RETURN_IF_ERROR(AddEnvValue(value, &entries));
  return Build(std::move(entries), kApiKeysEnv);
}

absl::StatusOr<KeyStore> KeyStore::Load(const std::string& path) {
  std::vector<std::pair<std::string, std::string>> entries;
  if (!path.empty()) KVD_RETURN_IF_ERROR(AddFile(path, &entries));
  if (const char* env = std::getenv(kApiKeysEnv); env != nullptr) {
    KVD_RETURN_IF_ERROR(AddEnvValue(env, &entries));
  }
  return Build(std::move(entries),
               path.empty() ? std::string(kApiKeysEnv)
                            : absl::StrCat(path, " + ", kApiKeysEnv));
}

absl::StatusOr<std::string> KeyStore::TenantForKey(
    absl::string_view key) const {
  if (!enabled()) return std::string(kLocalTenant);
  const Entry* found = nullptr;
  // No early exit: the time must not reveal which key (if any) matched.
  for (const Entry& e : entries_) {
    if (ConstantTimeEquals(e.key, key)) found = &e;
  }
  if (found == nullptr) {
    return absl::UnauthenticatedError(
        "unknown API key; send 'authorization: Bearer <key>' with a key "
        "configured on this node");
  }
  return found->tenant;
}

KeyStore KeyStore::TrustingRouters(std::string router_token,
                                   bool by_certificate) {
  KeyStore k;
  k.router_token_ = std::move(router_token);
  k.by_certificate_ = by_certificate;
  return k;
}

absl::StatusOr<std::string> KeyStore::TenantForRequest(
    absl::string_view authorization_header, absl::string_view forwarded_tenant,
    absl::string_view peer_certificate_name) const {
  if (router_token_.empty()) return TenantForBearer(authorization_header);
  const absl::string_view header =
      absl::StripAsciiWhitespace(authorization_header);
  constexpr absl::string_view kScheme = "bearer ";
  if (header.size() <= kScheme.size() ||
      !absl::StartsWithIgnoreCase(header, kScheme) ||
      !ConstantTimeEquals(
          absl::StripAsciiWhitespace(header.substr(kScheme.size())),
          router_token_)) {
    return absl::PermissionDeniedError(
        "this node serves a cluster and takes requests only from its "
        "routers: send them to a kvd router (tools/cluster/up.sh prints its "
        "URL)");
  }
  if (by_certificate_ && !IdentityFromCommonName(peer_certificate_name).ok()) {
    return absl::PermissionDeniedError(absl::StrCat(
        "the router token counts only from a router or node of the cluster "
        "presenting its certificate (mutual TLS), and this caller presented ",
        peer_certificate_name.empty()
            ? std::string("none")
            : absl::StrCat("one naming '", peer_certificate_name, "'"),
        ": send requests through a kvd router (tools/cluster/up.sh prints "
        "its URL)"));
  }
  if (absl::Status valid = storage::ValidateName("tenant", forwarded_tenant);
      !valid.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the router forwarded no valid tenant in ",
                     kForwardedTenantHeader, ": ", valid.message()));
  }
  return std::string(forwarded_tenant);
}

absl::StatusOr<std::string> KeyStore::TenantForBearer(
    absl::string_view authorization_header) const {
  if (entries_.empty()) return std::string(kLocalTenant);
  absl::string_view header = absl::StripAsciiWhitespace(authorization_header);
  if (header.empty()) {
    return absl::UnauthenticatedError(
        "missing API key; send the header 'authorization: Bearer <key>'");
  }
  constexpr absl::string_view kScheme = "bearer ";
  if (header.size() <= kScheme.size() ||
      !absl::StartsWithIgnoreCase(header, kScheme)) {
    return absl::UnauthenticatedError(
        "the authorization header must be 'Bearer <key>'");
  }
  return TenantForKey(
      absl::StripAsciiWhitespace(header.substr(kScheme.size())));
}

}  // namespace kvd::node
