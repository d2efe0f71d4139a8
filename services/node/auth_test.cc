#include "services/node/auth.h"

#include <cstdlib>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvd::node {
namespace {

using ::testing::HasSubstr;

TEST(KeyStoreTest, WithoutKeysEveryRequestIsLocal) {
  KeyStore keys;
  EXPECT_FALSE(keys.enabled());
  EXPECT_EQ(*keys.TenantForBearer(""), "local");
  EXPECT_EQ(*keys.TenantForBearer("Bearer anything"), "local");
}

TEST(KeyStoreTest, BearerMapsToTenant) {
  absl::StatusOr<KeyStore> keys =
      KeyStore::FromPairs({{"sk-a", "acme"}, {"sk-b", "globex"}});
  ASSERT_TRUE(keys.ok()) << keys.status();
  EXPECT_TRUE(keys->enabled());
  EXPECT_EQ(*keys->TenantForBearer("Bearer sk-a"), "acme");
  EXPECT_EQ(*keys->TenantForBearer("bearer   sk-b "), "globex");
  EXPECT_EQ(keys->TenantForBearer("Bearer sk-c").status().code(),
            absl::StatusCode::kUnauthenticated);
  // A prefix or extension of a key is not the key.
  EXPECT_EQ(keys->TenantForBearer("Bearer sk-").status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(keys->TenantForBearer("Bearer sk-aa").status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(keys->TenantForBearer("").status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(keys->TenantForBearer("Basic sk-a").status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(keys->TenantForBearer("Bearer ").status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(keys->TenantForBearer("").status().message(),
              HasSubstr("Bearer"));
}

TEST(KeyStoreTest, RejectsBadEntries) {
  EXPECT_EQ(KeyStore::FromPairs({{"k", "bad/tenant"}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KeyStore::FromPairs({{"", "acme"}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::Status dup =
      KeyStore::FromPairs({{"k", "acme"}, {"k", "globex"}}).status();
  EXPECT_EQ(dup.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(dup.message(), HasSubstr("twice"));
}

TEST(KeyStoreTest, EnvValue) {
  absl::StatusOr<KeyStore> keys =
      KeyStore::FromEnvValue("key1:tenant1, key:with:colon:tenant2");
  ASSERT_TRUE(keys.ok()) << keys.status();
  EXPECT_EQ(keys->size(), 2u);
  EXPECT_EQ(*keys->TenantForKey("key1"), "tenant1");
  EXPECT_EQ(*keys->TenantForKey("key:with:colon"), "tenant2");
  EXPECT_EQ(KeyStore::FromEnvValue("nocolon").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KeyStore::FromEnvValue("key:").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(KeyStoreTest, FileAndEnvTogether) {
  const std::string path =
      std::string(std::getenv("TEST_TMPDIR")) + "/keys.txt";
  {
    std::ofstream out(path);
    out << "# comment\n\nsk-file acme  # trailing comment\n";
  }
  absl::StatusOr<KeyStore> file_only = KeyStore::FromFile(path);
  ASSERT_TRUE(file_only.ok()) << file_only.status();
  EXPECT_EQ(file_only->size(), 1u);
  EXPECT_EQ(*file_only->TenantForKey("sk-file"), "acme");

  setenv(kApiKeysEnv, "sk-env:globex", 1);
  absl::StatusOr<KeyStore> both = KeyStore::Load(path);
  unsetenv(kApiKeysEnv);
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ(*both->TenantForKey("sk-file"), "acme");
  EXPECT_EQ(*both->TenantForKey("sk-env"), "globex");

  absl::StatusOr<KeyStore> none = KeyStore::Load("");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->enabled());

  EXPECT_EQ(KeyStore::FromFile(path + ".missing").status().code(),
            absl::StatusCode::kNotFound);
  {
    std::ofstream out(path);
    out << "sk-only-key\n";
  }
  absl::Status bad = KeyStore::FromFile(path).status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.message(), HasSubstr(":1:"));
}

TEST(ConstantTimeEqualsTest, Basics) {
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "ab"));
  EXPECT_FALSE(ConstantTimeEquals("", "a"));
  // Equal bytes up to the shorter length, with the rest zero, still differ.
  EXPECT_FALSE(ConstantTimeEquals(absl::string_view("a\0", 2), "a"));
}

TEST(KeyStoreTest, UnderMutualTlsTheRouterTokenNeedsAClusterCertificate) {
  const KeyStore keys = KeyStore::TrustingRouters("router-secret",
                                                  /*by_certificate=*/true);
  EXPECT_TRUE(keys.requires_peer_certificate());
  // A router's or a node's certificate, with the token: served.
  for (const char* peer : {"router:r1", "node:n2"}) {
    absl::StatusOr<std::string> t =
        keys.TenantForRequest("Bearer router-secret", "acme", peer);
    ASSERT_TRUE(t.ok()) << peer << ": " << t.status();
    EXPECT_EQ(*t, "acme");
  }
  // The token stolen, sent with no certificate or one naming nothing of
  // the cluster: refused, saying what was presented.
  for (const char* peer : {"", "kvd node", "admin:x"}) {
    absl::Status refused =
        keys.TenantForRequest("Bearer router-secret", "acme", peer).status();
    EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied) << peer;
    EXPECT_THAT(refused.message(), HasSubstr("mutual TLS")) << peer;
  }
  // A certificate does not stand in for the token.
  EXPECT_EQ(keys.TenantForRequest("", "acme", "router:r1").status().code(),
            absl::StatusCode::kPermissionDenied);
}

TEST(KeyStoreTest, ANodeTrustingRoutersTakesTheForwardedTenantOnly) {
  const KeyStore keys = KeyStore::TrustingRouters("router-secret");
  EXPECT_TRUE(keys.trusts_routers());
  absl::StatusOr<std::string> t =
      keys.TenantForRequest("Bearer router-secret", "acme");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*t, "acme");
  // A client's own key, no key, or a wrong token: use a router.
  for (const char* auth :
       {"", "Bearer sk-123", "Bearer router-secreT", "Basic router-secret"}) {
    absl::StatusOr<std::string> refused = keys.TenantForRequest(auth, "acme");
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied)
        << auth;
    EXPECT_NE(refused.status().message().find("router"), std::string::npos);
  }
  // The router token without a valid tenant is the router's bug, not a
  // tenant of its own.
  for (const char* tenant : {"", "a/b", "x\n"}) {
    EXPECT_EQ(
        keys.TenantForRequest("Bearer router-secret", tenant).status().code(),
        absl::StatusCode::kInvalidArgument)
        << tenant;
  }
  // Without a router token the forwarded header means nothing.
  absl::StatusOr<std::string> open = KeyStore().TenantForRequest("", "acme");
  ASSERT_TRUE(open.ok());
  EXPECT_EQ(*open, kLocalTenant);
}

}  // namespace
}  // namespace kvd::node
