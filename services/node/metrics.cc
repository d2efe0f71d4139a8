#include "services/node/metrics.h"

#include <cmath>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kvd::node {
namespace {

std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) {
    return absl::StrFormat("%d", static_cast<int64_t>(v));
  }
  // The shortest form that reads back as the same double.
  for (int precision = 1; precision < 17; ++precision) {
    std::string s = absl::StrFormat("%.*g", precision, v);
    if (std::strtod(s.c_str(), nullptr) == v) return s;
  }
  return absl::StrFormat("%.17g", v);
}

std::string FormatLabels(const MetricLabels& labels,
                         const std::pair<std::string, std::string>* extra) {
  if (labels.empty() && extra == nullptr) return "";
  std::string out = "{";
  bool first = true;
  auto add = [&](const std::string& k, const std::string& v) {
    if (!first) out += ",";
    first = false;
    absl::StrAppend(&out, k, "=\"", EscapeMetricLabelValue(v), "\"");
  };
  for (const auto& [k, v] : labels) add(k, v);
  if (extra != nullptr) add(extra->first, extra->second);
  out += "}";
  return out;
}

std::string EscapeHelp(const std::string& help) {
  std::string out;
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

std::string EscapeMetricLabelValue(const std::string& value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

void Metrics::Declare(const std::string& name, const std::string& help,
                      Type type, std::vector<double> buckets) {
  absl::MutexLock lock(&mu_);
  Family& f = families_[name];
  f.type = type;
  f.help = help;
  f.buckets = std::move(buckets);
}

void Metrics::DeclareCounter(const std::string& name, const std::string& help) {
  Declare(name, help, Type::kCounter, {});
}
void Metrics::DeclareGauge(const std::string& name, const std::string& help) {
  Declare(name, help, Type::kGauge, {});
}
void Metrics::DeclareHistogram(const std::string& name, const std::string& help,
                               std::vector<double> buckets) {
  Declare(name, help, Type::kHistogram, std::move(buckets));
}

void Metrics::Add(const std::string& name, const MetricLabels& labels,
                  double delta) {
  if (!(delta >= 0)) return;
  absl::MutexLock lock(&mu_);
  auto it = families_.find(name);
  if (it == families_.end() || it->second.type != Type::kCounter) return;
  it->second.values[labels] += delta;
}

void Metrics::Set(const std::string& name, const MetricLabels& labels,
                  double value) {
  absl::MutexLock lock(&mu_);
  auto it = families_.find(name);
  if (it == families_.end() || it->second.type == Type::kHistogram) return;
  it->second.values[labels] = value;
}

void Metrics::Observe(const std::string& name, const MetricLabels& labels,
                      double value) {
  if (std::isnan(value)) return;
  absl::MutexLock lock(&mu_);
  auto it = families_.find(name);
  if (it == families_.end() || it->second.type != Type::kHistogram) return;
  Family& f = it->second;
  Histogram& h = f.histograms[labels];
  if (h.counts.empty()) h.counts.assign(f.buckets.size() + 1, 0);
  size_t b = 0;
  while (b < f.buckets.size() && value > f.buckets[b]) ++b;
  h.counts[b] += 1;
  h.sum += value;
  h.count += 1;
}

double Metrics::Value(const std::string& name,
                      const MetricLabels& labels) const {
  absl::MutexLock lock(&mu_);
  auto it = families_.find(name);
  if (it == families_.end()) return 0;
  if (it->second.type == Type::kHistogram) {
    auto h = it->second.histograms.find(labels);
    return h == it->second.histograms.end() ? 0 : h->second.count;
  }
  auto v = it->second.values.find(labels);
  return v == it->second.values.end() ? 0 : v->second;
}

std::string Metrics::Render() const {
  absl::MutexLock lock(&mu_);
  std::string out;
  for (const auto& [name, f] : families_) {
    const char* type = f.type == Type::kCounter ? "counter"
                       : f.type == Type::kGauge ? "gauge"
                                                : "histogram";
    absl::StrAppend(&out, "# HELP ", name, " ", EscapeHelp(f.help), "\n");
    absl::StrAppend(&out, "# TYPE ", name, " ", type, "\n");
    if (f.type != Type::kHistogram) {
      for (const auto& [labels, v] : f.values) {
        absl::StrAppend(&out, name, FormatLabels(labels, nullptr), " ",
                        FormatValue(v), "\n");
      }
      continue;
    }
    for (const auto& [labels, h] : f.histograms) {
      double cumulative = 0;
      for (size_t b = 0; b <= f.buckets.size(); ++b) {
        cumulative += h.counts[b];
        const std::pair<std::string, std::string> le{
            "le", b < f.buckets.size() ? FormatValue(f.buckets[b]) : "+Inf"};
        absl::StrAppend(&out, name, "_bucket", FormatLabels(labels, &le), " ",
                        FormatValue(cumulative), "\n");
      }
      absl::StrAppend(&out, name, "_sum", FormatLabels(labels, nullptr), " ",
                      FormatValue(h.sum), "\n");
      absl::StrAppend(&out, name, "_count", FormatLabels(labels, nullptr), " ",
                      FormatValue(h.count), "\n");
    }
  }
  return out;
}

}  // namespace kvd::node
