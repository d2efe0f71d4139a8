#include "services/cluster/node_info.h"

#include "gtest/gtest.h"

namespace kvd::cluster {
namespace {

TEST(NodeInfoTest, RoundTripsEveryField) {
  NodeInfo n;
  n.id = "n1";
  n.incarnation = "00ff";
  n.http_url = "http://127.0.0.1:8080";
  n.grpc_address = "127.0.0.1:7070";
  n.model_id = "smollm2";
  n.model_fingerprint = "abc";
  n.precision = "bf16";
  n.numerics_version = 3;
  n.max_inflight = 4;
  n.max_queue = 12;
  n.load = {2, 1, 5, 1024, 4096, 77, "the disk is full"};
  absl::StatusOr<NodeInfo> back = DecodeNodeInfo(EncodeNodeInfo(n));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(EncodeNodeInfo(*back), EncodeNodeInfo(n));
  EXPECT_EQ(back->load.turns_committed, 77);
  EXPECT_EQ(back->load.not_writable, "the disk is full");
  EXPECT_DOUBLE_EQ(back->Utilization(), 3.0 / 16.0);
}

TEST(NodeInfoTest, RefusesWhatIsNotANodeDescription) {
  for (const char* bad : {"", "[]", "{\"id\":\"n1\"}", "{\"running\":1}",
                          "{\"id\":\"n1\",\"model\":{\"id\":\"m\"}}"}) {
    EXPECT_EQ(DecodeNodeInfo(bad).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

}  // namespace
}  // namespace kvd::cluster
