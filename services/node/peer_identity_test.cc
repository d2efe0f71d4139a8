// The identities a certificate's common name may state, and what is refused.
#include "services/node/peer_identity.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvd::node {
namespace {

using ::testing::HasSubstr;

TEST(PeerIdentityTest, NodesAndRoutersByTheirCommonName) {
  absl::StatusOr<PeerIdentity> n = IdentityFromCommonName("node:n1");
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(n->role, PeerIdentity::Role::kNode);
  EXPECT_EQ(n->id, "n1");
  EXPECT_EQ(Describe(*n), "node 'n1'");
  absl::StatusOr<PeerIdentity> r = IdentityFromCommonName("router:edge-2");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->role, PeerIdentity::Role::kRouter);
  EXPECT_EQ(r->id, "edge-2");
  EXPECT_EQ(CommonNameFor(PeerIdentity::Role::kRouter, "edge-2"),
            "router:edge-2");
  EXPECT_EQ(CommonNameFor(PeerIdentity::Role::kNode, "n1"), "node:n1");
}

TEST(PeerIdentityTest, OtherNamesAreNoIdentity) {
  // The one certificate every node shared before identities; no id; an id
  // that is not a node id; another role.
  for (const char* name : {"kvd node", "node:", "router:", "node:a/b",
                           "node:..", "admin:n1", "Node:n1", ""}) {
    absl::StatusOr<PeerIdentity> p = IdentityFromCommonName(name);
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_THAT(p.status().message(), HasSubstr("make_certs.sh")) << name;
  }
}

TEST(PeerIdentityTest, NoCertificateInTheText) {
  EXPECT_EQ(CertificateCommonName("not a certificate").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CertificateCommonName("").status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvd::node
