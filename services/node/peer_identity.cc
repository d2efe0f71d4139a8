#include "services/node/peer_identity.h"

#include <openssl/bio.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <memory>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "storage/checkpoint/codec.h"

namespace kvd::node {
namespace {

constexpr absl::string_view kNodePrefix = "node:";
constexpr absl::string_view kRouterPrefix = "router:";

}  // namespace

std::string CommonNameFor(PeerIdentity::Role role, absl::string_view id) {
  return absl::StrCat(
      role == PeerIdentity::Role::kNode ? kNodePrefix : kRouterPrefix, id);
}

std::string Describe(const PeerIdentity& peer) {
  return absl::StrCat(
      peer.role == PeerIdentity::Role::kNode ? "node" : "router", " '", peer.id,
      "'");
}

absl::StatusOr<PeerIdentity> IdentityFromCommonName(absl::string_view name) {
  PeerIdentity peer;
  absl::string_view id;
  if (absl::StartsWith(name, kNodePrefix)) {
    peer.role = PeerIdentity::Role::kNode;
    id = name.substr(kNodePrefix.size());
  } else if (absl::StartsWith(name, kRouterPrefix)) {
    peer.role = PeerIdentity::Role::kRouter;
    id = name.substr(kRouterPrefix.size());
  }
  if (!storage::ValidateName("node or router id", id).ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the certificate's common name '", name,
        "' names no node or router of the cluster ('node:ID' or "
        "'router:ID'); issue one per node and router with "
        "tools/cluster/make_certs.sh DIR --node ID (or --router ID)"));
  }
  peer.id = std::string(id);
  return peer;
}

absl::StatusOr<std::string> CertificateCommonName(absl::string_view pem) {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(
      BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())), &BIO_free);
  std::unique_ptr<X509, decltype(&X509_free)> cert(
      bio == nullptr ? nullptr
                     : PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr),
      &X509_free);
  if (cert == nullptr) {
    return absl::InvalidArgumentError("no PEM certificate in the text");
  }
  std::string name = CommonNameOf(cert.get());
  if (name.empty()) {
    return absl::InvalidArgumentError("the certificate has no common name");
  }
  return name;
}

std::string CommonNameOf(const X509* cert) {
  char name[256];
  const int n = X509_NAME_get_text_by_NID(X509_get_subject_name(cert),
                                          NID_commonName, name, sizeof(name));
  return n > 0 ? std::string(name, static_cast<size_t>(n)) : std::string();
}

absl::StatusOr<PeerIdentity> PeerOf(const grpc::AuthContext& context) {
  if (!context.IsPeerAuthenticated()) {
    return absl::UnauthenticatedError(
        "the caller presented no certificate of the cluster CA (mutual TLS)");
  }
  const std::vector<grpc::string_ref> names =
      context.FindPropertyValues("x509_common_name");
  if (names.size() != 1) {
    return absl::PermissionDeniedError(
        "the caller's certificate has no single common name naming a node or "
        "router of the cluster");
  }
  absl::StatusOr<PeerIdentity> peer = IdentityFromCommonName(
      absl::string_view(names[0].data(), names[0].size()));
  if (!peer.ok()) return absl::PermissionDeniedError(peer.status().message());
  return peer;
}

}  // namespace kvd::node
