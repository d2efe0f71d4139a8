#include "services/router/routing.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "services/cluster/membership.h"
#include "services/node/openai_request.h"

namespace kvd::router {

Routing::Routing() {
  metrics_.DeclareCounter("kvd_router_requests_total",
                          "Requests by routing decision and status code.");
  metrics_.DeclareCounter("kvd_router_directory_ops_total",
                          "Directory reads and transactions, by operation.");
  metrics_.DeclareCounter("kvd_router_errors_total", "Routing errors by kind.");
  metrics_.DeclareCounter("kvd_router_retries_total",
                          "Stateless requests tried on another node.");
  metrics_.DeclareHistogram(
      "kvd_router_upstream_seconds",
      "Time until a node answered with its response headers.",
      {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10});
  metrics_.DeclareGauge("kvd_router_live_nodes", "Nodes in membership.");
  metrics_.DeclareGauge("kvd_router_draining_nodes", "Nodes being drained.");
  metrics_.DeclareGauge("kvd_router_membership_synced",
                        "1 while the membership watch is up to date.");
  metrics_.DeclareGauge("kvd_router_membership_resyncs",
                        "Membership reloads after etcd compacted the watch's "
                        "revision.");
}

absl::StatusOr<std::unique_ptr<Routing>> Routing::Connect(
    const std::string& etcd_endpoint) {
  return Connect(cluster::EtcdClientOptions{.endpoint = etcd_endpoint});
}

absl::StatusOr<std::unique_ptr<Routing>> Routing::Connect(
    const cluster::EtcdClientOptions& etcd_options) {
  std::unique_ptr<Routing> r(new Routing());
  absl::StatusOr<std::unique_ptr<cluster::EtcdClient>> etcd =
      cluster::EtcdClient::Connect(etcd_options);
  if (!etcd.ok()) return etcd.status();
  r->etcd_ = std::move(*etcd);
  r->directory_ = std::make_unique<cluster::SessionDirectory>(r->etcd_.get());
  absl::StatusOr<std::unique_ptr<cluster::PrefixWatch>> nodes =
      cluster::PrefixWatch::Start(r->etcd_.get(),
                                  {.prefix = cluster::kNodesPrefix});
  if (!nodes.ok()) return nodes.status();
  r->nodes_ = std::move(*nodes);
  absl::StatusOr<std::unique_ptr<cluster::PrefixWatch>> drains =
      cluster::PrefixWatch::Start(r->etcd_.get(),
                                  {.prefix = cluster::kDrainPrefix});
  if (!drains.ok()) return drains.status();
  r->drains_ = std::move(*drains);
  return r;
}

std::vector<cluster::NodeInfo> Routing::LiveNodes() {
  std::vector<cluster::NodeInfo> out;
  for (const auto& [key, kv] : nodes_->Snapshot()) {
    absl::StatusOr<cluster::NodeInfo> n = cluster::DecodeNodeInfo(kv.value);
    if (!n.ok()) continue;  // not a kvd node's description: never a target
    placement_.Reported(n->id, kv.mod_revision);
    out.push_back(*std::move(n));
  }
  return out;
}

std::set<std::string> Routing::Drained() {
  std::set<std::string> out;
  for (const auto& [key, kv] : drains_->Snapshot()) {
    out.insert(key.substr(sizeof(cluster::kDrainPrefix) - 1));
  }
  return out;
}

absl::StatusOr<Target> Routing::Owner(const std::string& tenant,
                                      const std::string& session,
                                      const std::string& model,
                                      cluster::DirectoryEntry* entry) {
  metrics_.Add("kvd_router_directory_ops_total", {{"op", "lookup"}});
  absl::StatusOr<std::optional<cluster::DirectoryEntry>> e =
      directory_->Lookup(tenant, session);
  if (!e.ok()) return e.status();
  if (!e->has_value()) {
    return absl::NotFoundError(
        absl::StrCat("session '", session, "' not found"));
  }
  if (entry != nullptr) *entry = **e;
  for (cluster::NodeInfo& n : LiveNodes()) {
    if (n.id != (*e)->owner) continue;
    if (!model.empty() && n.model_id != model) {
      return node::RequestError(
          "model", absl::StrCat("session '", session, "' belongs to model '",
                                n.model_id, "', not '", model, "'"));
    }
    return Target{std::move(n), "owner"};
  }
  metrics_.Add("kvd_router_errors_total", {{"kind", "owner_down"}});
  return absl::UnavailableError(absl::StrCat(
      "session '", session, "' lives on node '", (*e)->owner,
      "', which is not live (stopped, restarting or cut off from etcd); "
      "retry after a while: a replica of it is promoted once the node's "
      "lease ends (sessions kept with --replicas 2 or more), otherwise it "
      "comes back with its node"));
}

absl::Status Routing::TakeMigration(const std::string& tenant) {
  absl::Status allowed = migrations_->Take(tenant, "migrations");
  if (!allowed.ok()) {
    metrics_.Add("kvd_router_errors_total", {{"kind", "rate_limited"}});
  }
  return allowed;
}

absl::StatusOr<Target> Routing::Place(const std::string& tenant,
                                      const std::string& session,
                                      const std::string& model) {
  for (int attempt = 0; attempt < 3; ++attempt) {
    absl::StatusOr<Target> owner = Owner(tenant, session, model, nullptr);
    if (owner.status().code() != absl::StatusCode::kNotFound) return owner;
    if (absl::Status allowed = creations_->Take(tenant, "new sessions");
        !allowed.ok()) {
      metrics_.Add("kvd_router_errors_total", {{"kind", "rate_limited"}});
      return allowed;
    }
    const std::vector<cluster::NodeInfo> live = LiveNodes();
    absl::StatusOr<std::string> id =
        placement_.Pick(live, model, Drained(), /*commits=*/true);
    if (!id.ok()) {
      metrics_.Add("kvd_router_errors_total", {{"kind", "no_node"}});
      return id.status();
    }
    metrics_.Add("kvd_router_directory_ops_total", {{"op", "create"}});
    absl::StatusOr<cluster::DirectoryEntry> created =
        directory_->Create(tenant, session, *id);
    if (created.status().code() == absl::StatusCode::kAlreadyExists) {
      continue;  // another router placed it first: follow its choice
    }
    if (!created.ok()) return created.status();
    placement_.Placed(*id);
    for (const cluster::NodeInfo& n : live) {
      if (n.id == *id) return Target{n, "placed"};
    }
  }
  return absl::AbortedError(absl::StrCat(
      "session '", session, "' kept changing in the directory; retry"));
}

absl::StatusOr<Target> Routing::Stateless(const std::string& model,
                                          const std::set<std::string>& skip) {
  std::vector<cluster::NodeInfo> live = LiveNodes();
  std::vector<cluster::NodeInfo> usable;
  for (cluster::NodeInfo& n : live) {
    if (skip.count(n.id) == 0) usable.push_back(std::move(n));
  }
  absl::StatusOr<std::string> id =
      placement_.Pick(usable, model, Drained(), /*commits=*/false);
  if (!id.ok()) {
    metrics_.Add("kvd_router_errors_total", {{"kind", "no_node"}});
    return id.status();
  }
  for (cluster::NodeInfo& n : usable) {
    if (n.id == *id) return Target{std::move(n), "stateless"};
  }
  return absl::InternalError("placement chose a node it was not offered");
}

}  // namespace kvd::router
