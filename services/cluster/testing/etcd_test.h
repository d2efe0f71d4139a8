// A test fixture with a fresh real etcd (EtcdProcess) and a client of it, for
// the cluster's tests against etcd itself.
//
//   class DirectoryTest : public testing::EtcdTest {};
//   TEST_F(DirectoryTest, ...) { SessionDirectory dir(client_.get()); }
//
// Thread-safety: as a gtest fixture; client_ is thread-safe.
#ifndef KVD_SERVICES_CLUSTER_TESTING_ETCD_TEST_H_
#define KVD_SERVICES_CLUSTER_TESTING_ETCD_TEST_H_

#include <cstdlib>
#include <memory>

#include "gtest/gtest.h"
#include "services/cluster/etcd_client.h"
#include "services/cluster/testing/etcd_process.h"

namespace kvd::cluster::testing {

class EtcdTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    auto etcd = EtcdProcess::Start(tmp != nullptr ? tmp : "/tmp");
    ASSERT_TRUE(etcd.ok()) << etcd.status();
    etcd_ = std::move(*etcd);
    auto client = EtcdClient::Connect({.endpoint = etcd_->endpoint()});
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = std::move(*client);
  }

  std::unique_ptr<EtcdProcess> etcd_;
  std::unique_ptr<EtcdClient> client_;
};

}  // namespace kvd::cluster::testing

#endif  // KVD_SERVICES_CLUSTER_TESTING_ETCD_TEST_H_
