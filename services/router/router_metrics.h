// The router's Prometheus metrics: routing decisions, directory operations,
// upstream latency, retries and errors, served at GET /metrics.
//
//   metrics.Count("kvd_router_requests_total", {{"route", "owner"}});
//   metrics.ObserveUpstream(0.012);
//   std::string text = metrics.Render();
//
// Thread-safety: all methods may be called concurrently.
#ifndef KVD_SERVICES_ROUTER_ROUTER_METRICS_H_
#define KVD_SERVICES_ROUTER_ROUTER_METRICS_H_

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace kvd::router {

class RouterMetrics {
 public:
  using Labels = std::vector<std::pair<std::string, std::string>>;

  // Adds `by` to the counter `name` with `labels`.
  void Count(const std::string& name, const Labels& labels, double by = 1);
  // Seconds until a node answered with its response headers.
  void ObserveUpstream(double seconds);
  // Gauges computed at render time (live nodes, watch state) are appended.
  std::string Render(const std::string& extra_gauges) const;

 private:
  static constexpr std::array<double, 12> kBuckets = {
      0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10};
  mutable absl::Mutex mu_;
  // name -> (rendered labels -> value)
  std::map<std::string, std::map<std::string, double>> counters_
      ABSL_GUARDED_BY(mu_);
  std::array<int64_t, kBuckets.size()> upstream_buckets_
      ABSL_GUARDED_BY(mu_) = {};
  int64_t upstream_count_ ABSL_GUARDED_BY(mu_) = 0;
  double upstream_sum_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvd::router

#endif  // KVD_SERVICES_ROUTER_ROUTER_METRICS_H_
