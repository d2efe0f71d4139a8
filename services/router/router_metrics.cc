#include "services/router/router_metrics.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"

namespace kvd::router {

void RouterMetrics::Count(const std::string& name, const Labels& labels,
                          double by) {
  std::vector<std::string> parts;
  for (const auto& [k, v] : labels) {
    parts.push_back(absl::StrCat(
        k, "=\"",
        absl::StrReplaceAll(v, {{"\\", "\\\\"}, {"\"", "\\\""}, {"\n", "\\n"}}),
        "\""));
  }
  const std::string rendered =
      parts.empty() ? "" : absl::StrCat("{", absl::StrJoin(parts, ","), "}");
  absl::MutexLock lock(&mu_);
  counters_[name][rendered] += by;
}

void RouterMetrics::ObserveUpstream(double seconds) {
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < kBuckets.size(); ++i) {
    if (seconds <= kBuckets[i]) upstream_buckets_[i]++;
  }
  upstream_count_++;
  upstream_sum_ += seconds;
}

std::string RouterMetrics::Render(const std::string& extra_gauges) const {
  absl::MutexLock lock(&mu_);
  std::string out;
  for (const auto& [name, series] : counters_) {
    absl::StrAppend(&out, "# TYPE ", name, " counter\n");
    for (const auto& [labels, v] : series) {
      absl::StrAppend(&out, name, labels, " ", v, "\n");
    }
  }
  absl::StrAppend(&out, "# TYPE kvd_router_upstream_seconds histogram\n");
  for (size_t i = 0; i < kBuckets.size(); ++i) {
    absl::StrAppend(&out, "kvd_router_upstream_seconds_bucket{le=\"",
                    kBuckets[i], "\"} ", upstream_buckets_[i], "\n");
  }
  absl::StrAppend(&out, "kvd_router_upstream_seconds_bucket{le=\"+Inf\"} ",
                  upstream_count_, "\n");
  absl::StrAppend(&out, "kvd_router_upstream_seconds_sum ", upstream_sum_,
                  "\n");
  absl::StrAppend(&out, "kvd_router_upstream_seconds_count ", upstream_count_,
                  "\n");
  absl::StrAppend(&out, extra_gauges);
  return out;
}

}  // namespace kvd::router
