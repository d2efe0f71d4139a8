// Who is on the other end of a cluster connection, by its certificate.
// Inside a cluster every node and router holds a certificate of the cluster
// CA naming what it is in its common name: "node:<node id>" or
// "router:<router id>" (tools/cluster/make_certs.sh --node ID / --router
// ID). Servers that require client certificates (mutual TLS) learn the
// caller's identity from the certificate the handshake verified, so calls
// are authorized by who the caller is, not by a shared secret it holds:
// only nodes may call kvd.v1.Migration (which writes checkpoints), whatever
// token a router sends.
//
//   absl::StatusOr<PeerIdentity> peer = PeerOf(*ctx->auth_context());
//   if (!peer.ok() || peer->role != PeerIdentity::Role::kNode) ...refuse...
//
// Thread-safety: free functions over immutable values.
#ifndef KVD_SERVICES_NODE_PEER_IDENTITY_H_
#define KVD_SERVICES_NODE_PEER_IDENTITY_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/security/auth_context.h"
#include "openssl/x509.h"

namespace kvd::node {

struct PeerIdentity {
  enum class Role { kNode, kRouter };
  Role role = Role::kNode;
  std::string id;  // the node's or router's id
};

// "node:n1", "router:r1".
std::string CommonNameFor(PeerIdentity::Role role, absl::string_view id);
// "node 'n1'", "router 'r1'": for messages.
std::string Describe(const PeerIdentity& peer);

// The identity a certificate's common name states. INVALID_ARGUMENT for any
// other name (e.g. the one certificate every node shared before identities
// were issued), saying how to issue one.
absl::StatusOr<PeerIdentity> IdentityFromCommonName(absl::string_view name);

// The common name of the (first) certificate in PEM text, e.g. a node's own
// --tls-cert, to check it names the node it is given to. INVALID_ARGUMENT
// when the text holds no certificate or the certificate no common name.
absl::StatusOr<std::string> CertificateCommonName(absl::string_view pem);
// The common name of a parsed certificate; "" if it has none.
std::string CommonNameOf(const X509* cert);

// The identity of a gRPC caller whose certificate the TLS handshake
// verified against the cluster CA. UNAUTHENTICATED when the call carries no
// verified certificate (plain TCP, or TLS without client certificates);
// PERMISSION_DENIED when the certificate names no cluster identity.
absl::StatusOr<PeerIdentity> PeerOf(const grpc::AuthContext& context);

}  // namespace kvd::node

#endif  // KVD_SERVICES_NODE_PEER_IDENTITY_H_
