// Proves the protobuf/gRPC code generation macro works: messages round-trip
// through the wire format and the generated service stub exists.
#include "gtest/gtest.h"
#include "proto/kvd/v1/health.grpc.pb.h"
#include "proto/kvd/v1/health.pb.h"

namespace {

TEST(HealthProto, RoundTripsThroughTheWireFormat) {
  kvd::v1::HealthResponse r;
  r.set_status(kvd::v1::HealthResponse::SERVING);
  r.set_model("SmolLM2-135M");
  r.set_numerics_version(1);
  kvd::v1::HealthResponse back;
  ASSERT_TRUE(back.ParseFromString(r.SerializeAsString()));
  EXPECT_EQ(back.status(), kvd::v1::HealthResponse::SERVING);
  EXPECT_EQ(back.model(), "SmolLM2-135M");
  EXPECT_EQ(back.numerics_version(), 1u);
  EXPECT_STREQ(kvd::v1::Health::service_full_name(), "kvd.v1.Health");
}

}  // namespace
