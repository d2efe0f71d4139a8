// What a process's TLS flags make of it: mutual TLS only when its
// certificate names this very process, a refusal naming the fix when it
// names another, and plain TLS (with a warning) for the shared certificate
// of old. Certificates from tools/cluster/make_certs.sh.
#include "tools/kvd/cluster_tls.h"

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/cluster/testing/certs.h"

namespace kvd::cli {
namespace {

using ::testing::HasSubstr;
using Role = node::PeerIdentity::Role;

class ClusterTlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const char* tmp = std::getenv("TEST_TMPDIR");
    dir_ = new std::string(absl::StrCat(tmp ? tmp : "/tmp", "/certs"));
    for (const char* args : {"--node n1", "--router r1", ""}) {
      testing::MakeCerts(*dir_, args);
    }
  }
  static std::string Path(const std::string& name) {
    return absl::StrCat(*dir_, "/", name);
  }
  static std::string* dir_;
};
std::string* ClusterTlsTest::dir_ = nullptr;

TEST_F(ClusterTlsTest, ItsOwnCertificateMeansMutualTls) {
  absl::StatusOr<ClusterTls> tls =
      LoadClusterTls(Path("ca.pem"), Path("node-n1.pem"), Path("node-n1.key"),
                     Role::kNode, "n1");
  ASSERT_TRUE(tls.ok()) << tls.status();
  EXPECT_TRUE(tls->mutual);
  EXPECT_FALSE(tls->ca_pem.empty());
  EXPECT_FALSE(tls->key_pem.empty());
  tls = LoadClusterTls(Path("ca.pem"), Path("router-r1.pem"),
                       Path("router-r1.key"), Role::kRouter, "");
  ASSERT_TRUE(tls.ok()) << tls.status();
  EXPECT_TRUE(tls->mutual);
}

TEST_F(ClusterTlsTest, AnotherProcesssCertificateIsRefused) {
  absl::Status s = LoadClusterTls(Path("ca.pem"), Path("node-n1.pem"),
                                  Path("node-n1.key"), Role::kNode, "n2")
                       .status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("make_certs.sh DIR --node n2"));
  s = LoadClusterTls(Path("ca.pem"), Path("router-r1.pem"),
                     Path("router-r1.key"), Role::kNode, "n1")
          .status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("router 'r1'"));
}

TEST_F(ClusterTlsTest, MutualTlsNeedsTheCa) {
  const absl::Status s = LoadClusterTls("", Path("node-n1.pem"),
                                        Path("node-n1.key"), Role::kNode, "n1")
                             .status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("--ca-cert"));
}

TEST_F(ClusterTlsTest, TheSharedCertificateOfOldIsPlainTls) {
  absl::StatusOr<ClusterTls> tls = LoadClusterTls(
      Path("ca.pem"), Path("node.pem"), Path("node.key"), Role::kNode, "n1");
  ASSERT_TRUE(tls.ok()) << tls.status();
  EXPECT_FALSE(tls->mutual);
}

TEST_F(ClusterTlsTest, FilesThatCannotBeReadOrPairAreRefused) {
  EXPECT_EQ(
      LoadClusterTls(Path("ca.pem"), Path("node-n1.pem"), "", Role::kNode, "n1")
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadClusterTls(Path("missing.pem"), "", "", Role::kNode, "n1")
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  // No role asked (kvd cluster): the files are only read.
  absl::StatusOr<ClusterTls> any =
      LoadClusterTls(Path("ca.pem"), Path("router-r1.pem"),
                     Path("router-r1.key"), std::nullopt, "");
  ASSERT_TRUE(any.ok()) << any.status();
  EXPECT_FALSE(any->mutual);
}

}  // namespace
}  // namespace kvd::cli
