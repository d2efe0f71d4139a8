// Membership against a real etcd: a node is listed while its lease lives,
// its id cannot be taken twice, a lost lease is noticed (self-fencing) and
// the node comes back, and leaving removes it at once.
#include "services/cluster/membership.h"

#include <atomic>
#include <memory>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/cluster/testing/etcd_test.h"

namespace kvd::cluster {
namespace {

using ::testing::HasSubstr;

class MembershipTest : public testing::EtcdTest {
 protected:
  // Waits up to `limit` for `done`.
  static bool Eventually(const std::function<bool()>& done,
                         absl::Duration limit = absl::Seconds(20)) {
    const absl::Time deadline = absl::Now() + limit;
    while (!done()) {
      if (absl::Now() > deadline) return false;
      absl::SleepFor(absl::Milliseconds(50));
    }
    return true;
  }
};

TEST_F(MembershipTest, RegisteredNodeIsListedKeptAliveAndUnique) {
  std::atomic<int> load{1};
  NodeRegistration::Options o;
  o.node_id = "n1";
  o.ttl = absl::Seconds(2);
  o.describe = [&load] {
    return absl::StrCat("{\"running\":", load.load(), "}");
  };
  auto reg = NodeRegistration::Start(client_.get(), o);
  ASSERT_TRUE(reg.ok()) << reg.status();
  EXPECT_TRUE((*reg)->registered());
  EXPECT_EQ((*reg)->incarnation().size(), 16u);

  auto nodes = ListNodes(client_.get());
  ASSERT_TRUE(nodes.ok()) << nodes.status();
  ASSERT_EQ(nodes->size(), 1u);
  EXPECT_EQ((*nodes)[0].first, "n1");
  EXPECT_EQ((*nodes)[0].second, "{\"running\":1}");

  // A second live process with the same id is refused.
  auto twin = NodeRegistration::Start(client_.get(), o);
  EXPECT_EQ(twin.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(twin.status().message(), HasSubstr("--node-id"));

  // Kept alive past two TTLs, with its description refreshed.
  load = 7;
  absl::SleepFor(absl::Seconds(5));
  EXPECT_TRUE((*reg)->registered());
  EXPECT_TRUE((*reg)->LeaseLive());
  EXPECT_TRUE(Eventually([&] {
    auto n = ListNodes(client_.get());
    return n.ok() && n->size() == 1 && (*n)[0].second == "{\"running\":7}";
  }));

  // Leaving removes the key at once.
  reg->reset();
  auto after = ListNodes(client_.get());
  ASSERT_TRUE(after.ok());
  EXPECT_TRUE(after->empty());
}

TEST_F(MembershipTest, LostLeaseIsNoticedAndTheNodeComesBack) {
  std::atomic<int> lost{0};
  NodeRegistration::Options o;
  o.node_id = "n2";
  o.ttl = absl::Seconds(3);
  o.on_lost = [&lost] { ++lost; };
  auto reg = NodeRegistration::Start(client_.get(), o);
  ASSERT_TRUE(reg.ok()) << reg.status();
  const int64_t first_lease = (*reg)->lease();
  // As if etcd had expired it (the process paused past its TTL).
  ASSERT_TRUE(client_->RevokeLease(first_lease).ok());
  EXPECT_TRUE(Eventually([&] { return lost.load() == 1; }));
  EXPECT_TRUE(Eventually(
      [&] { return (*reg)->registered() && (*reg)->lease() != first_lease; }));
  auto nodes = ListNodes(client_.get());
  ASSERT_TRUE(nodes.ok());
  ASSERT_EQ(nodes->size(), 1u);
  EXPECT_EQ((*nodes)[0].first, "n2");
}

}  // namespace
}  // namespace kvd::cluster
