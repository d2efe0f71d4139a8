#include "services/node/metrics.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvd::node {
namespace {

using ::testing::HasSubstr;

// Expected text written by hand from the Prometheus text format spec
// (https://prometheus.io/docs/instrumenting/exposition_formats/).
TEST(Metrics, RendersCountersGaugesAndCumulativeHistograms) {
  Metrics m;
  m.DeclareCounter("req_total", "Requests.");
  m.DeclareGauge("depth", "Queue depth.");
  m.DeclareHistogram("lat_seconds", "Latency.", {0.1, 1});
  m.Add("req_total", {{"code", "200"}});
  m.Add("req_total", {{"code", "200"}}, 2);
  m.Add("req_total", {{"code", "429"}});
  m.Add("req_total", {{"code", "429"}}, -5);  // ignored
  m.Set("depth", {}, 3);
  m.Observe("lat_seconds", {}, 0.05);
  m.Observe("lat_seconds", {}, 0.1);  // le is inclusive
  m.Observe("lat_seconds", {}, 0.5);
  m.Observe("lat_seconds", {}, 7);
  m.Add("undeclared", {});  // dropped
  EXPECT_EQ(m.Render(),
            "# HELP depth Queue depth.\n"
            "# TYPE depth gauge\n"
            "depth 3\n"
            "# HELP lat_seconds Latency.\n"
            "# TYPE lat_seconds histogram\n"
            "lat_seconds_bucket{le=\"0.1\"} 2\n"
            "lat_seconds_bucket{le=\"1\"} 3\n"
            "lat_seconds_bucket{le=\"+Inf\"} 4\n"
            "lat_seconds_sum 7.65\n"
            "lat_seconds_count 4\n"
            "# HELP req_total Requests.\n"
            "# TYPE req_total counter\n"
            "req_total{code=\"200\"} 3\n"
            "req_total{code=\"429\"} 1\n");
  EXPECT_EQ(m.Value("req_total", {{"code", "200"}}), 3);
  EXPECT_EQ(m.Value("lat_seconds", {}), 4);
  EXPECT_EQ(m.Value("missing", {}), 0);
}

TEST(Metrics, EscapesLabelValues) {
  EXPECT_EQ(EscapeMetricLabelValue("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
  Metrics m;
  m.DeclareGauge("g", "G.");
  m.Set("g", {{"path", "x\"y"}, {"a", "1"}}, 1.5);
  EXPECT_THAT(m.Render(), HasSubstr("g{a=\"1\",path=\"x\\\"y\"} 1.5\n"));
}

}  // namespace
}  // namespace kvd::node
