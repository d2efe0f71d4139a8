#include "services/router/placement.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kvd::router {

double Placement::Score(const cluster::NodeInfo& n) {
  const double slots =
      static_cast<double>(std::max<int64_t>(1, n.max_inflight + n.max_queue));
  return n.Utilization() + static_cast<double>(inflight_[n.id]) / slots +
         0.01 * static_cast<double>(placed_[n.id]);
}

absl::StatusOr<std::string> Placement::Pick(
    const std::vector<cluster::NodeInfo>& nodes, const std::string& model,
    const std::set<std::string>& drained, bool commits) {
  std::vector<const cluster::NodeInfo*> serving, open;
  std::set<std::string> models;
  const cluster::NodeInfo* unwritable = nullptr;  // one, for the message
  for (const cluster::NodeInfo& n : nodes) {
    models.insert(n.model_id);
    if (n.model_id != model || n.http_url.empty()) continue;
    serving.push_back(&n);
    if (drained.count(n.id) != 0) continue;
    if (commits && !n.load.not_writable.empty()) {
      unwritable = &n;
      continue;
    }
    open.push_back(&n);
  }
  if (serving.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "no live node serves model '", model, "'; the cluster serves: ",
        models.empty() ? std::string("nothing (no live nodes)")
                       : absl::StrJoin(models, ", ")));
  }
  if (open.empty() && unwritable != nullptr) {
    return absl::UnavailableError(absl::StrCat(
        "no node serving model '", model, "' can commit turns now; node '",
        unwritable->id, "' reports: ", unwritable->load.not_writable));
  }
  if (open.empty()) {
    return absl::UnavailableError(absl::StrCat(
        "every node serving model '", model,
        "' is draining; retry later or undrain one (kvd cluster undrain)"));
  }
  absl::MutexLock lock(&mu_);
  if (open.size() == 1) return open[0]->id;
  std::uniform_int_distribution<size_t> pick(0, open.size() - 1);
  const size_t a = pick(rng_);
  size_t b = pick(rng_);
  while (b == a) b = pick(rng_);
  const double sa = Score(*open[a]), sb = Score(*open[b]);
  if (sa == sb) return open[rng_() % 2 == 0 ? a : b]->id;
  return open[sa < sb ? a : b]->id;
}

void Placement::Placed(const std::string& node) {
  absl::MutexLock lock(&mu_);
  placed_[node]++;
}

void Placement::Started(const std::string& node) {
  absl::MutexLock lock(&mu_);
  inflight_[node]++;
}

void Placement::Finished(const std::string& node) {
  absl::MutexLock lock(&mu_);
  if (inflight_[node] > 0) inflight_[node]--;
}

void Placement::Reported(const std::string& node, int64_t report_id) {
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = report_.emplace(node, report_id);
  if (!inserted && it->second != report_id) {
    it->second = report_id;
    placed_[node] = 0;
  }
}

}  // namespace kvd::router
