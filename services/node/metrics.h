// Prometheus metrics for the node's front ends (HTTP and gRPC): counters,
// gauges and histograms with labels, rendered in the Prometheus text
// exposition format (version 0.0.4) for GET /metrics.
//
// A family is declared once (name, help, type, and for histograms the bucket
// upper bounds); samples are then added by label set. Values a scrape must
// read from elsewhere (queue depth, bytes per tier) are set as gauges just
// before Render().
//
//   Metrics m;
//   m.DeclareCounter("kvd_http_requests_total", "HTTP requests by code.");
//   m.Add("kvd_http_requests_total", {{"code", "200"}});
//   m.DeclareHistogram("kvd_ttft_seconds", "Time to first token.",
//                      {0.05, 0.1, 0.5, 1});
//   m.Observe("kvd_ttft_seconds", {}, 0.07);
//   std::string text = m.Render();
//
// Samples of an undeclared family are dropped (a programming error that
// must not take a server down). Thread-safety: all methods may be called
// concurrently.
#ifndef KVD_SERVICES_NODE_METRICS_H_
#define KVD_SERVICES_NODE_METRICS_H_

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace kvd::node {

// Label name -> value; ordered, so a label set has one canonical form.
using MetricLabels = std::map<std::string, std::string>;

class Metrics {
 public:
  void DeclareCounter(const std::string& name, const std::string& help);
  void DeclareGauge(const std::string& name, const std::string& help);
  // `buckets`: increasing finite upper bounds; +Inf is implied.
  void DeclareHistogram(const std::string& name, const std::string& help,
                        std::vector<double> buckets);

  // Counter += delta (delta >= 0; negative deltas are ignored).
  void Add(const std::string& name, const MetricLabels& labels,
           double delta = 1);
  // A gauge's value, or a counter mirrored from a component that counts
  // itself (e.g. SessionEngine::stats()).
  void Set(const std::string& name, const MetricLabels& labels, double value);
  void Observe(const std::string& name, const MetricLabels& labels,
               double value);

  // The current value of a counter or gauge sample (0 if absent); for
  // histograms, the observation count. For tests and logs.
  double Value(const std::string& name, const MetricLabels& labels) const;

  // Every family in name order, samples in label order.
  std::string Render() const;

 private:
  enum class Type { kCounter, kGauge, kHistogram };
  struct Histogram {
    std::vector<double> counts;  // per bucket, not cumulative; last = +Inf
    double sum = 0;
    double count = 0;
  };
  struct Family {
    Type type = Type::kCounter;
    std::string help;
    std::vector<double> buckets;
    std::map<MetricLabels, double> values;
    std::map<MetricLabels, Histogram> histograms;
  };
  void Declare(const std::string& name, const std::string& help, Type type,
               std::vector<double> buckets);

  mutable absl::Mutex mu_;
  std::map<std::string, Family> families_ ABSL_GUARDED_BY(mu_);
};

// A label value escaped for the text format (backslash, quote, newline).
std::string EscapeMetricLabelValue(const std::string& value);

}  // namespace kvd::node

#endif  // KVD_SERVICES_NODE_METRICS_H_
