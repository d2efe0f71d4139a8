// Identity inside the cluster, by certificate (mutual TLS): a node's
// kvd.v1.Migration, which writes checkpoints, answers only callers whose
// certificate of the cluster CA names a node. A router's certificate with
// the router token, the token without a certificate, the one certificate
// nodes used to share, and a forged "node" certificate of another CA are
// all refused; a node presenting its own (as PeerOptions makes it) is
// served. Certificates come from tools/cluster/make_certs.sh, a real gRPC
// server listens on loopback, and a real engine answers behind it.
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "ops/model/testing/tiny_model.h"
#include "proto/kvd/v1/migration.grpc.pb.h"
#include "services/engine/session_engine.h"
#include "services/engine/testing/engine_fixture.h"
#include "services/migration/migration_service.h"
#include "services/migration/outbound.h"
#include "services/migration/testing/served_migration.h"
#include "services/transport/loopback_transport.h"
#include "tools/cluster/testing/certs.h"

namespace kvd {
namespace {

using ::testing::HasSubstr;

constexpr char kToken[] = "cluster-token";

struct Identity {
  std::string cert, key;
};

class MutualTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto model = ops::testing::LoadTinyModel(ops::testing::TinyModelSpec(),
                                             ops::Precision::kF32);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = *std::move(model);
    auto store =
        engine::testing::OpenTestStore(engine::testing::FreshTestDir("store"));
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
    engine::SessionEngineOptions o;
    o.node_id = "n1";
    engine_ = std::make_unique<engine::SessionEngine>(
        *model_, engine::ModelIdentityOf(*model_, "sha256:tiny"), store_.get(),
        o);
    certs_ = engine::testing::FreshTestDir("certs");
    foreign_ = engine::testing::FreshTestDir("foreign-ca");
    testing::MakeCerts(certs_, "--node n1");
    testing::MakeCerts(certs_, "--node n2");
    testing::MakeCerts(certs_, "--router r1");
    testing::MakeCerts(certs_, "");  // the shared "kvd node" certificate of old
    testing::MakeCerts(foreign_, "--node n2");  // same name, another CA: forged
    if (HasFatalFailure()) return;
    ca_ = testing::ReadPemFile(certs_ + "/ca.pem");

    grpc::SslServerCredentialsOptions ssl(
        GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
    ssl.pem_root_certs = ca_;
    ssl.pem_key_cert_pairs.push_back(
        {testing::ReadPemFile(certs_ + "/node-n1.key"),
         testing::ReadPemFile(certs_ + "/node-n1.pem")});
    served_ = migration::testing::ServeMigration(
        engine_.get(), &plane_, migration::InboundOptions(),
        migration::MigrationAuth{.cluster_token = kToken,
                                 .by_certificate = true},
        grpc::SslServerCredentials(ssl));
  }

  Identity Of(const std::string& dir, const std::string& name) {
    return {testing::ReadPemFile(dir + "/" + name + ".pem"),
            testing::ReadPemFile(dir + "/" + name + ".key")};
  }

  // kvd.v1.Migration/ReplicaStatus on n1, presenting `who` (none when
  // empty) with the router token.
  grpc::Status Ask(const Identity& who) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = ca_;
    ssl.pem_cert_chain = who.cert;
    ssl.pem_private_key = who.key;
    auto stub = v1::Migration::NewStub(
        grpc::CreateChannel(served_->address, grpc::SslCredentials(ssl)));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(20));
    ctx.AddMetadata("authorization", absl::StrCat("Bearer ", kToken));
    v1::ReplicaStatusRequest req;
    req.set_tenant("acme");
    req.set_session_id("chat-1");
    v1::ReplicaStatusResponse resp;
    return stub->ReplicaStatus(&ctx, req, &resp);
  }

  std::unique_ptr<ops::Model> model_;
  std::unique_ptr<storage::TieredStore> store_;
  std::unique_ptr<engine::SessionEngine> engine_;
  transport::LoopbackTransport plane_;
  std::string certs_, foreign_, ca_;
  std::unique_ptr<migration::testing::ServedMigration> served_;
};

TEST_F(MutualTlsTest, ANodesCertificateIsServed) {
  // Authorized: the engine answers (it holds no replica of the session).
  const grpc::Status s = Ask(Of(certs_, "node-n2"));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  // As a node's own calls present it (PeerOptions' client certificate).
  absl::StatusOr<v1::ReplicaStatusResponse> r = migration::QueryReplica(
      migration::PeerNode{served_->address, "sha256:tiny"},
      migration::PeerOptions{.cluster_token = "not even the token",
                             .ca_cert_pem = ca_,
                             .client_cert_pem = Of(certs_, "node-n2").cert,
                             .client_key_pem = Of(certs_, "node-n2").key},
      "acme", "chat-1");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound) << r.status();
}

TEST_F(MutualTlsTest, ARoutersCertificateMayNotWriteCheckpoints) {
  const grpc::Status s = Ask(Of(certs_, "router-r1"));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(s.error_message(), HasSubstr("router 'r1'"));
  EXPECT_THAT(s.error_message(), HasSubstr("may not write checkpoints"));
}

TEST_F(MutualTlsTest, AStolenTokenWithoutACertificateIsRefused) {
  const grpc::Status s = Ask(Identity{});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED)
      << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("no certificate"));
}

TEST_F(MutualTlsTest, TheSharedCertificateOfOldNamesNoNode) {
  const grpc::Status s = Ask(Of(certs_, "node"));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(s.error_message(), HasSubstr("make_certs.sh"));
}

TEST_F(MutualTlsTest, AForgedNodeCertificateOfAnotherCaFailsTheHandshake) {
  // Names node n2, but the cluster CA did not sign it: no call gets through.
  const grpc::Status s = Ask(Of(foreign_, "node-n2"));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
}

}  // namespace
}  // namespace kvd
