#include "services/cluster/prefix_watch.h"

#include <atomic>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "services/cluster/testing/etcd_test.h"

namespace kvd::cluster {
namespace {

class PrefixWatchTest : public testing::EtcdTest {};

// Polls until `pred` holds or 10 s pass.
template <typename Pred>
bool Eventually(Pred pred) {
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (absl::Now() < until) {
    if (pred()) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return pred();
}

TEST_F(PrefixWatchTest, StartsWithTheStoreAndFollowsPutsAndDeletes) {
  ASSERT_TRUE(client_->Put("/p/a", "1").ok());
  ASSERT_TRUE(client_->Put("/other", "x").ok());
  std::atomic<int> changes{0};
  PrefixWatch::Options o;
  o.prefix = "/p/";
  o.on_change = [&] { changes++; };
  auto w = PrefixWatch::Start(client_.get(), o);
  ASSERT_TRUE(w.ok()) << w.status();
  auto snap = (*w)->Snapshot();
  ASSERT_EQ(snap.size(), 1u);
  EXPECT_EQ(snap.at("/p/a").value, "1");

  ASSERT_TRUE(client_->Put("/p/b", "2").ok());
  ASSERT_TRUE(client_->Put("/p/a", "3").ok());
  ASSERT_TRUE(client_->Delete("/p/b").ok());
  absl::StatusOr<int64_t> last = client_->Put("/other", "y");
  ASSERT_TRUE(last.ok());
  ASSERT_TRUE(Eventually([&] {
    auto s = (*w)->Snapshot();
    return s.size() == 1 && s.at("/p/a").value == "3" && !(s.count("/p/b") > 0);
  }));
  EXPECT_TRUE((*w)->synced());
  EXPECT_EQ((*w)->resyncs(), 0);
  EXPECT_GE(changes.load(), 2);
}

// History the watch would resume from is compacted while it is not
// watching: it must notice and reload the prefix, not miss the changes.
TEST_F(PrefixWatchTest, SurvivesCompactionOfItsResumeRevision) {
  ASSERT_TRUE(client_->Put("/p/a", "1").ok());
  ASSERT_TRUE(client_->Put("/p/b", "1").ok());
  std::atomic<bool> once{false};
  PrefixWatch::Options o;
  o.prefix = "/p/";
  o.after_load_for_test = [&] {
    if (once.exchange(true)) return;
    ASSERT_TRUE(client_->Delete("/p/a").ok());
    ASSERT_TRUE(client_->Put("/p/c", "2").ok());
    absl::StatusOr<int64_t> rev = client_->Put("/p/b", "2");
    ASSERT_TRUE(rev.ok());
    ASSERT_TRUE(client_->Compact(*rev).ok());
  };
  auto w = PrefixWatch::Start(client_.get(), o);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE(Eventually([&] { return (*w)->resyncs() == 1; }));
  ASSERT_TRUE(Eventually([&] {
    auto s = (*w)->Snapshot();
    return s.size() == 2 && (s.count("/p/c") > 0) && s.at("/p/b").value == "2";
  }));
  // And it keeps watching after the reload.
  ASSERT_TRUE(client_->Put("/p/d", "3").ok());
  ASSERT_TRUE(Eventually([&] { return (*w)->Snapshot().count("/p/d") > 0; }));
}

TEST_F(PrefixWatchTest, AnUnreachableEtcdIsAnError) {
  auto far = EtcdClient::Connect({.endpoint = "127.0.0.1:1",
                                  .timeout = absl::Milliseconds(200),
                                  .retry_for = absl::Milliseconds(300)});
  EXPECT_EQ(far.status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace kvd::cluster
