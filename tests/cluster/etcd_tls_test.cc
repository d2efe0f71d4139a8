// etcd as a kvd cluster runs it when secured: TLS with client certificates
// (--client-cert-auth) and etcd's own authentication, each node and router
// an etcd user named by its certificate, in a role that may read and write
// only /kvd/. A real etcd, certificates from tools/cluster/make_certs.sh.
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "services/cluster/etcd_client.h"
#include "services/cluster/testing/etcd_process.h"
#include "tools/cluster/testing/certs.h"

namespace kvd::cluster {
namespace {

class EtcdTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    dir_ = absl::StrCat(tmp ? tmp : "/tmp", "/etcd-tls");
    certs_ = dir_ + "/certs";
    foreign_ = dir_ + "/foreign";
    for (const std::string args : {"--etcd e1", "--client root", "--node n1",
                                   "--node n2", "--router r1"}) {
      kvd::testing::MakeCerts(certs_, args);
    }
    kvd::testing::MakeCerts(foreign_,
                            "--node n1");  // the same name under another CA
    if (HasFatalFailure()) return;
    testing::EtcdProcess::Tls tls;
    tls.ca_file = certs_ + "/ca.pem";
    tls.cert_file = certs_ + "/etcd-e1.pem";
    tls.key_file = certs_ + "/etcd-e1.key";
    tls.client_cert_file = certs_ + "/client-root.pem";
    tls.client_key_file = certs_ + "/client-root.key";
    auto etcd = testing::EtcdProcess::Start(dir_, tls);
    ASSERT_TRUE(etcd.ok()) << etcd.status();
    etcd_ = *std::move(etcd);
    auto root = Client(certs_, "client-root");
    ASSERT_TRUE(root.ok()) << root.status();
    root_ = *std::move(root);
    ASSERT_TRUE(root_->EnableAuth({"node:n1", "router:r1"}).ok());
  }

  // A client presenting `name`'s certificate from `dir` (none if empty),
  // trusting the cluster CA.
  absl::StatusOr<std::unique_ptr<EtcdClient>> Client(const std::string& dir,
                                                     const std::string& name) {
    EtcdClientOptions o;
    o.endpoint = etcd_->endpoint();
    o.timeout = absl::Seconds(5);
    o.retry_for = absl::Seconds(1);
    o.ca_pem = kvd::testing::ReadPemFile(certs_ + "/ca.pem");
    if (!name.empty()) {
      o.cert_pem = kvd::testing::ReadPemFile(dir + "/" + name + ".pem");
      o.key_pem = kvd::testing::ReadPemFile(dir + "/" + name + ".key");
    }
    return EtcdClient::Connect(o);
  }

  std::string dir_, certs_, foreign_;
  std::unique_ptr<testing::EtcdProcess> etcd_;
  std::unique_ptr<EtcdClient> root_;
};

TEST_F(EtcdTlsTest, ANodeMayUseOnlyTheKvdPrefix) {
  auto n1 = Client(certs_, "node-n1");
  ASSERT_TRUE(n1.ok()) << n1.status();
  EXPECT_TRUE((*n1)->Put("/kvd/v1/nodes/n1", "up").ok());
  absl::StatusOr<std::optional<EtcdKeyValue>> got =
      (*n1)->Get("/kvd/v1/nodes/n1");
  ASSERT_TRUE(got.ok() && got->has_value()) << got.status();
  EXPECT_EQ((*got)->value, "up");
  EXPECT_TRUE((*n1)->GrantLease(absl::Seconds(5)).ok());
  // Outside /kvd/: neither written nor read.
  EXPECT_EQ((*n1)->Put("/other/key", "x").status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ((*n1)->Get("/other/key").status().code(),
            absl::StatusCode::kPermissionDenied);
  auto r1 = Client(certs_, "router-r1");
  ASSERT_TRUE(r1.ok()) << r1.status();
  got = (*r1)->Get("/kvd/v1/nodes/n1");
  EXPECT_TRUE(got.ok() && got->has_value()) << got.status();
}

TEST_F(EtcdTlsTest, OnlyCertificatesOfTheClusterCaNamingAUserGetIn) {
  // No certificate; a certificate of the CA naming no etcd user; the same
  // name as a user, under another CA.
  EXPECT_FALSE(Client(certs_, "").ok());
  EXPECT_FALSE(Client(certs_, "node-n2").ok());
  EXPECT_FALSE(Client(foreign_, "node-n1").ok());
  // Plain gRPC to etcd's TLS port.
  EXPECT_FALSE(EtcdClient::Connect({.endpoint = etcd_->endpoint().substr(8),
                                    .timeout = absl::Seconds(2),
                                    .retry_for = absl::Seconds(0)})
                   .ok());
  // Root adds the node later (the setup runs again): it gets in.
  ASSERT_TRUE(root_->EnableAuth({"node:n2"}).ok());
  auto n2 = Client(certs_, "node-n2");
  ASSERT_TRUE(n2.ok()) << n2.status();
  EXPECT_TRUE((*n2)->Put("/kvd/v1/nodes/n2", "up").ok());
}

}  // namespace
}  // namespace kvd::cluster
