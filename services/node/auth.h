// API keys (DESIGN.md section 6: "API keys, sessions scoped to their
// owner"). A KeyStore maps bearer keys to tenants; the gRPC and HTTP front
// ends ask it which tenant a request's `authorization` header belongs to and
// pass that tenant to the engine, so a session is only ever visible to the
// tenant that created it.
//
// Keys come from a file of lines "<key> <tenant>" ('#' starts a comment,
// blank lines are skipped) and/or from the environment variable
// KVD_API_KEYS="key1:tenant1,key2:tenant2". With no keys configured the
// node is open: every request is tenant "local" (a laptop, a test).
//
//   KVD_ASSIGN_OR_RETURN(KeyStore keys, KeyStore::Load(flags.keys_file));
//   KVD_ASSIGN_OR_RETURN(std::string tenant,
//                        keys.TenantForBearer("Bearer sk-123"));
//
// Thread-safety: immutable after construction; all const methods may be
// called concurrently.
#ifndef KVD_SERVICES_NODE_AUTH_H_
#define KVD_SERVICES_NODE_AUTH_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvd::node {

// The tenant of every request on a node without configured keys.
inline constexpr char kLocalTenant[] = "local";
// The environment variable KeyStore::Load reads.
inline constexpr char kApiKeysEnv[] = "KVD_API_KEYS";

class KeyStore {
 public:
  // No keys: every request is tenant "local".
  KeyStore() = default;

  // Keys from `path` (if non-empty) plus those in $KVD_API_KEYS (if set).
  // INVALID_ARGUMENT (naming the file and line, or the variable) for a
  // malformed entry, a tenant that is not a valid name, or a key given
  // twice; NOT_FOUND if `path` does not exist.
  static absl::StatusOr<KeyStore> Load(const std::string& path);
  // One of the two sources alone.
  static absl::StatusOr<KeyStore> FromFile(const std::string& path);
  static absl::StatusOr<KeyStore> FromEnvValue(absl::string_view value);
  // `entries`: (key, tenant) pairs; same checks as Load.
  static absl::StatusOr<KeyStore> FromPairs(
      std::vector<std::pair<std::string, std::string>> entries);

  // A node in a cluster trusts only its routers (DESIGN.md section 7): a
  // request must carry "Bearer <router_token>" (the secret the cluster's
  // routers share with its nodes) and its tenant, which the router took
  // from the client's API key, in the header kForwardedTenantHeader. API
  // keys are checked at the router, not here.
  // With `by_certificate` (mutual TLS), the token counts only from a caller
  // whose verified certificate names a router or a node of the cluster
  // (peer_identity.h): the token alone, stolen, opens nothing.
  static KeyStore TrustingRouters(std::string router_token,
                                  bool by_certificate = false);

  // Whether any key is configured (otherwise the node is open).
  bool enabled() const { return !entries_.empty() || !router_token_.empty(); }
  bool trusts_routers() const { return !router_token_.empty(); }
  size_t size() const { return entries_.size(); }

  // The tenant owning `key`. Without configured keys: "local" for any key.
  // UNAUTHENTICATED for an unknown key. Compares against every key in time
  // independent of where (or whether) the key matches.
  absl::StatusOr<std::string> TenantForKey(absl::string_view key) const;

  // The tenant of a request whose `authorization` header (gRPC metadata or
  // HTTP header) is `authorization_header`, "Bearer <key>" (the scheme is
  // case-insensitive). Without configured keys: "local", whatever the
  // header. UNAUTHENTICATED for a missing/empty header, another scheme, or
  // an unknown key; the message says how to send a key.
  absl::StatusOr<std::string> TenantForBearer(
      absl::string_view authorization_header) const;

  // The tenant of a request: TenantForBearer's, or, trusting routers, the
  // forwarded tenant of a request that carries the router token
  // (PERMISSION_DENIED otherwise, saying to use a router).
  // `peer_certificate_name`: the common name of the certificate the caller's
  // TLS handshake verified ("" for none); what by_certificate judges.
  absl::StatusOr<std::string> TenantForRequest(
      absl::string_view authorization_header,
      absl::string_view forwarded_tenant,
      absl::string_view peer_certificate_name = {}) const;
  bool requires_peer_certificate() const { return by_certificate_; }

 private:
  struct Entry {
    std::string key;
    std::string tenant;
  };
  absl::Status Add(std::string key, std::string tenant,
                   absl::string_view where);

  std::vector<Entry> entries_;
  std::string router_token_;
  bool by_certificate_ = false;
};

// The header (gRPC metadata key) a router forwards the tenant in.
inline constexpr char kForwardedTenantHeader[] = "x-kvd-tenant";
// The header (gRPC trailer key) on a refused turn that ran nothing and may
// be resent where the directory says the session lives now: "moving" or
// "moved" (engine::NotRunReason).
inline constexpr char kRetryHeader[] = "x-kvd-retry";

// Equality of `a` and `b` in time that depends only on their lengths, not on
// where they differ (so a remote caller cannot guess a key byte by byte).
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

}  // namespace kvd::node

#endif  // KVD_SERVICES_NODE_AUTH_H_
