// `kvd serve`: one node serving durable sessions over an OpenAI-compatible
// HTTP API and gRPC (kvd.v1.Sessions), until SIGINT/SIGTERM.
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"
#include "services/cluster/membership.h"
#include "services/cluster/node_info.h"
#include "services/migration/drainer.h"
#include "services/migration/failover.h"
#include "services/migration/inbound.h"
#include "services/migration/migration_service.h"
#include "services/migration/migrator.h"
#include "services/migration/replicator.h"
#include "services/node/async_http.h"
#include "services/node/auth.h"
#include "services/node/cluster_member.h"
#include "services/node/grpc_service.h"
#include "services/node/http_server.h"
#include "services/transport/ucx_transport.h"
#include "tools/kvd/backend_flag.h"
#include "tools/kvd/cluster_tls.h"
#include "tools/kvd/commands.h"
#include "tools/kvd/session_runtime.h"

namespace kvd::cli {
namespace {

void DeclareFlags(Args& a) {
  a.Flag("config", "",
         "JSON file of flag values, e.g. {\"http-port\": 8080, \"model\": "
         "\"gemma3\"}; flags given on the command line win");
  a.Flag("host", "127.0.0.1",
         "address to listen on (0.0.0.0 for every interface)");
  a.Flag("http-port", "8080",
         "OpenAI-compatible HTTP API port (/v1/chat/completions, "
         "/v1/completions, /v1/models, /v1/sessions, /metrics, /healthz); "
         "-1 = off");
  a.Flag("grpc-port", "7070", "gRPC (kvd.v1.Sessions, Health) port; -1 = off");
  a.Flag("api-keys", "",
         "file of '<key> <tenant>' lines (also read: $KVD_API_KEYS as "
         "key:tenant,...); none = open node, every request is tenant 'local'");
  a.Flag("max-inflight", "16",
         "generations running at once (HTTP and gRPC together), decoded "
         "as one batch: on a CPU a step of 16 sequences costs little more "
         "than a step of 4, so fewer wait in the queue");
  a.Flag("max-queue", "32",
         "generations waiting for a slot (HTTP and gRPC together); beyond it "
         "requests get 429 with Retry-After (HTTP) or RESOURCE_EXHAUSTED "
         "with grpc-retry-pushback-ms (gRPC)");
  a.Flag("metrics-key", "",
         "if set, GET /metrics needs 'Authorization: Bearer <key>' (also "
         "read: $KVD_METRICS_KEY); default: /metrics is open, as Prometheus "
         "scrapes expect");
  a.Flag("http-threads", "0",
         "HTTP handler threads (a request holds one while it is handled; "
         "idle and slow connections hold none): 0 = max(128, inflight + "
         "queue + 8)");
  a.Flag("http-max-connections", "10000",
         "open HTTP connections at once; one more is answered 503 and "
         "closed");
  a.Flag("http-read-timeout", "10",
         "seconds a request may take to arrive whole, from its first byte, "
         "before its connection is closed");
  a.Flag("create-sessions", "on-first-use",
         "on-first-use: an HTTP turn for an unknown session_id starts it; "
         "explicit: it is 404 until the session is created (gRPC "
         "CreateSession), as a node in a cluster does");
  a.Flag("cluster", "",
         "etcd endpoint (host:port, or a comma-separated list of its members' "
         "IPv4 address:port) of the cluster to join: the node "
         "registers as --node-id, serves only sessions the directory gives "
         "it, and takes requests only from routers (--router-token); "
         "https://host:port for an etcd serving TLS (its --ca-cert and "
         "--tls-cert are then this node's too); empty = a standalone node");
  a.Flag("advertise", "",
         "host routers reach this node at (default: --host, or 127.0.0.1 "
         "when --host is 0.0.0.0)");
  a.Flag("lease-ttl", "15",
         "seconds the node's cluster lease lives without a keep-alive (sent "
         "every TTL/3); a node that misses it commits nothing until it has "
         "registered again");
  a.Flag("router-token", "",
         "in a cluster: the secret routers send as 'Authorization: Bearer "
         "<token>' with the tenant in X-Kvd-Tenant (also read: "
         "$KVD_ROUTER_TOKEN); other traffic is refused");
  a.Flag("ca-cert", "",
         "in a TLS cluster: PEM of the cluster CA, to verify the peers this "
         "node moves sessions to (tools/cluster/make_certs.sh makes it); "
         "with a --tls-cert naming this node ('node:ID', make_certs.sh "
         "--node ID), also the clients' (mutual TLS): the router token "
         "then counts only from a router's or node's certificate, and only "
         "nodes may write checkpoints here");
  a.Flag("ucx-tls", "",
         "UCX transports that carry moved sessions, in UCX_TLS syntax (tcp; "
         "sm = shared memory; empty = UCX's choice, which honours "
         "$UCX_TLS)");
  a.Flag("replicas", "1",
         "in a cluster: copies of each session's committed turns, this "
         "node's included (2 recommended: a replica takes over when the "
         "owner dies); in [1, 8]");
  a.Flag("rebalance-every", "10",
         "in a cluster: seconds between moves of an idle session off this "
         "node while it owns over 1.5x the mean sessions per node of its "
         "model (0: never)");
  a.Flag("replication", "sync",
         "sync: a turn is answered once its replicas hold it durably; async: "
         "answered at once, replicas follow (at most 64 turns behind)");
  a.Flag("tls-cert", "",
         "PEM certificate: serve HTTPS and gRPC over TLS; in a cluster, one "
         "naming this node (make_certs.sh DIR --node ID) is also presented "
         "to its peers (mutual TLS)");
  a.Flag("tls-key", "", "PEM private key for --tls-cert");
  DeclareModelFlags(a);
  DeclareStoreFlags(a);
  DeclareSessionFlags(a);
}

// --config's entries as "--name=value" arguments, placed before the command
// line's so that those win.
absl::StatusOr<std::vector<std::string>> ConfigArgs(
    const std::vector<std::string>& argv) {
  std::string path;
  for (size_t i = 0; i < argv.size(); ++i) {
    if (argv[i] == "--config" && i + 1 < argv.size()) path = argv[i + 1];
    if (argv[i].rfind("--config=", 0) == 0) path = argv[i].substr(9);
  }
  if (path.empty()) return std::vector<std::string>();
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot read --config file ", path));
  }
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/
                                           false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--config file ", path,
                     " must be one JSON object mapping flag names to values"));
  }
  std::vector<std::string> out;
  for (const auto& [key, value] : j.items()) {
    if (key == "config") continue;
    std::string v;
    if (value.is_string()) {
      v = value.get<std::string>();
    } else if (value.is_number() || value.is_boolean()) {
      v = value.dump();
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("--config file ", path, ": value of '", key,
                       "' must be a string, number or boolean"));
    }
    out.push_back(absl::StrCat("--", key, "=", v));
  }
  return out;
}

void DeclareClusterMetrics(node::Metrics& m) {
  m.DeclareCounter("kvd_migrations_total",
                   "Sessions this node moved to another node, by outcome.");
  m.DeclareCounter("kvd_migration_bytes_total",
                   "Bytes this node sent moving sessions (framing included).");
  m.DeclareCounter("kvd_inbound_transfers_total",
                   "Copies and updates other nodes sent here, by outcome.");
  m.DeclareCounter("kvd_replication_total",
                   "Replication work, by kind: updates applied by replicas, "
                   "copies that filled a new replica, failures, replicas "
                   "dropped from a set, turns left with a short set, "
                   "short sets refilled between turns.");
  m.DeclareGauge("kvd_replication_lag_turns",
                 "Async replication: turns committed, not yet sent (now "
                 "and the most seen).");
  m.DeclareCounter("kvd_failover_promotions_total",
                   "Sessions of a dead owner this node's controller moved to "
                   "a replica.");
  m.DeclareGauge("kvd_failover_controller",
                 "1 while this node is the cluster's failover controller.");
  m.DeclareGauge("kvd_draining", "1 while this node is draining.");
  m.DeclareCounter("kvd_drain_moves_total",
                   "Sessions this node's drain moved, by outcome.");
}

void SetClusterMetrics(node::Metrics& m, const migration::Migrator* migrator,
                       const migration::InboundTransfers* inbound,
                       const migration::Replicator* replicator,
                       const migration::FailoverController* failover,
                       const migration::Drainer* drainer) {
  auto set = [&m](const char* name, const node::MetricLabels& labels,
                  int64_t v) { m.Set(name, labels, static_cast<double>(v)); };
  if (migrator != nullptr) {
    const migration::MigratorStats s = migrator->stats();
    set("kvd_migrations_total", {{"outcome", "completed"}}, s.completed);
    set("kvd_migrations_total", {{"outcome", "failed"}}, s.failed);
    set("kvd_migration_bytes_total", {}, s.bytes_sent);
  }
  if (inbound != nullptr) {
    const migration::InboundStats s = inbound->stats();
    set("kvd_inbound_transfers_total", {{"outcome", "committed"}}, s.committed);
    set("kvd_inbound_transfers_total", {{"outcome", "failed"}}, s.failed);
  }
  if (replicator != nullptr) {
    const migration::ReplicatorStats s = replicator->stats();
    set("kvd_replication_total", {{"kind", "update"}}, s.turns_replicated);
    set("kvd_replication_total", {{"kind", "copy"}}, s.copies_sent);
    set("kvd_replication_total", {{"kind", "failure"}}, s.failures);
    set("kvd_replication_total", {{"kind", "replica_dropped"}},
        s.replicas_dropped);
    set("kvd_replication_total", {{"kind", "short_set"}}, s.short_sets);
    set("kvd_replication_total", {{"kind", "set_refilled"}}, s.sets_refilled);
    set("kvd_replication_lag_turns", {{"stat", "now"}}, s.lag_turns);
    set("kvd_replication_lag_turns", {{"stat", "max"}}, s.max_lag_turns);
  }
  if (failover != nullptr) {
    const migration::FailoverStats s = failover->stats();
    set("kvd_failover_promotions_total", {}, s.promoted);
    set("kvd_failover_controller", {}, s.leader ? 1 : 0);
  }
  if (drainer != nullptr) {
    const migration::DrainerStats s = drainer->stats();
    set("kvd_draining", {}, s.draining ? 1 : 0);
    set("kvd_drain_moves_total", {{"outcome", "moved"}}, s.moved);
    set("kvd_drain_moves_total", {{"outcome", "failed"}}, s.failed);
    set("kvd_drain_moves_total", {{"outcome", "rebalanced"}}, s.rebalanced);
  }
}

absl::Status Run(const Args& args) {
  KVD_ASSIGN_OR_RETURN(int64_t http_port, args.GetInt("http-port"));
  KVD_ASSIGN_OR_RETURN(int64_t grpc_port, args.GetInt("grpc-port"));
  KVD_ASSIGN_OR_RETURN(int64_t inflight, args.GetInt("max-inflight"));
  KVD_ASSIGN_OR_RETURN(int64_t queue, args.GetInt("max-queue"));
  if (http_port < -1 || http_port > 65535 || grpc_port < -1 ||
      grpc_port > 65535) {
    return absl::InvalidArgumentError("ports must be in [0, 65535] or -1");
  }
  KVD_ASSIGN_OR_RETURN(int64_t http_threads, args.GetInt("http-threads"));
  KVD_ASSIGN_OR_RETURN(int64_t read_timeout_s,
                       args.GetInt("http-read-timeout"));
  KVD_ASSIGN_OR_RETURN(int64_t max_connections,
                       args.GetIntIn("http-max-connections", 1, 1 << 20));
  if (http_threads < 0 || http_threads > 65536 || read_timeout_s < 1 ||
      read_timeout_s > 3600) {
    return absl::InvalidArgumentError(
        "--http-threads must be in [0, 65536] and --http-read-timeout in "
        "[1, 3600] seconds");
  }
  if (inflight < 1 || inflight > 4096 || queue < 0 || queue > 1 << 20) {
    return absl::InvalidArgumentError(
        "--max-inflight must be in [1, 4096] and --max-queue in [0, "
        "1048576]");
  }
  KVD_ASSIGN_OR_RETURN(node::KeyStore keys,
                       node::KeyStore::Load(args.Get("api-keys")));
  // Every open connection is a file descriptor.
  node::RaiseOpenFileLimit();
  std::unique_ptr<node::ClusterMember> member;
  std::string token;
  ClusterTls tls;  // in a cluster: its CA, and mutual TLS or not
  if (args.Has("cluster")) {
    token = args.Get("router-token");
    if (token.empty()) {
      if (const char* env = std::getenv("KVD_ROUTER_TOKEN")) token = env;
    }
    if (token.empty()) {
      return absl::InvalidArgumentError(
          "a node in a cluster needs --router-token (or $KVD_ROUTER_TOKEN): "
          "the secret its routers send; tools/cluster/up.sh makes one");
    }
    if (keys.enabled()) {
      return absl::InvalidArgumentError(
          "in a cluster, API keys are checked by the routers (kvd router "
          "--api-keys); give this node --router-token only");
    }
    KVD_ASSIGN_OR_RETURN(
        tls, LoadClusterTls(
                 args.Get("ca-cert"), args.Get("tls-cert"), args.Get("tls-key"),
                 node::PeerIdentity::Role::kNode, args.Get("node-id")));
    if (!tls.cert_pem.empty() && tls.ca_pem.empty()) {
      return absl::InvalidArgumentError(
          "a node serving TLS in a cluster needs --ca-cert, the cluster CA "
          "it verifies its peers with when it moves sessions to them");
    }
    keys = node::KeyStore::TrustingRouters(token, tls.mutual);
    KVD_ASSIGN_OR_RETURN(int64_t ttl_s, args.GetInt("lease-ttl"));
    if (ttl_s < 2 || ttl_s > 3600) {
      return absl::InvalidArgumentError("--lease-ttl must be in [2, 3600] s");
    }
    node::ClusterMemberOptions co;
    co.etcd_endpoint = args.Get("cluster");
    if (absl::StartsWith(co.etcd_endpoint, "https://")) {
      // etcd over TLS: the cluster CA, and this node's certificate as its
      // etcd user.
      co.etcd_ca_pem = tls.ca_pem;
      co.etcd_cert_pem = tls.cert_pem;
      co.etcd_key_pem = tls.key_pem;
    }
    co.node_id = args.Get("node-id");
    co.lease_ttl = absl::Seconds(ttl_s);
    co.max_inflight = inflight;
    co.max_queue = queue;
    KVD_ASSIGN_OR_RETURN(member, node::ClusterMember::Connect(std::move(co)));
  }
  // Block the stop signals before any server thread exists, so only
  // sigwait below receives them.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  KVD_ASSIGN_OR_RETURN(int64_t replicas, args.GetIntIn("replicas", 1, 8));
  KVD_ASSIGN_OR_RETURN(int64_t rebalance_s,
                       args.GetIntIn("rebalance-every", 0, 86400));
  const std::string replication = args.Get("replication");
  if (replication != "sync" && replication != "async") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--replication must be sync or async, not '", replication, "'"));
  }
  auto replicate =
      std::make_shared<std::atomic<migration::Replicator*>>(nullptr);
  KVD_ASSIGN_OR_RETURN(
      std::unique_ptr<node::NodeRuntime> rt,
      OpenSessionRuntime(
          args, /*show_progress=*/true,
          [&args, &member, &replicate](node::NodeOptions& o) -> absl::Status {
            if (member) {
              o.engine.fence = member->fence();
              // Set once the replicator exists (it needs the engine).
              o.engine.on_commit = [replicate](const storage::TurnUpdate& u) {
                migration::Replicator* r = replicate->load();
                return r != nullptr ? r->OnCommit(u) : absl::OkStatus();
              };
              o.engine.before_turn = [replicate](
                                         const v1::SessionManifest& committed) {
                migration::Replicator* r = replicate->load();
                return r != nullptr ? r->Settle(committed) : absl::OkStatus();
              };
            }
            const std::string mode = args.Get("create-sessions");
            if (mode != "on-first-use" && mode != "explicit") {
              return absl::InvalidArgumentError(
                  absl::StrCat("--create-sessions must be on-first-use or "
                               "explicit, not '",
                               mode, "'"));
            }
            o.create_sessions_on_first_use = mode == "on-first-use";
            return absl::OkStatus();
          }));
  // Moving sessions between nodes: the data plane (UCX), the inbound side
  // peers call over gRPC, the outbound Migrator, and the drain loop.
  std::unique_ptr<transport::UcxTransport> ucx;
  std::unique_ptr<migration::InboundTransfers> inbound;
  std::unique_ptr<migration::MigrationService> migration_service;
  std::shared_ptr<migration::Migrator> migrator;
  std::unique_ptr<migration::Drainer> drainer;
  std::unique_ptr<migration::Replicator> replicator;
  std::unique_ptr<migration::FailoverController> failover;
  if (member) {
    if (grpc_port < 0) {
      return absl::InvalidArgumentError(
          "a node in a cluster needs its gRPC API (--grpc-port): its peers "
          "move sessions to it over gRPC");
    }
    const std::string& ca_pem = tls.ca_pem;
    KVD_ASSIGN_OR_RETURN(
        ucx, transport::UcxTransport::Create({.tls = args.Get("ucx-tls")}));
    inbound = std::make_unique<migration::InboundTransfers>(
        &rt->engine(), ucx.get(), migration::InboundOptions());
    migration_service = std::make_unique<migration::MigrationService>(
        inbound.get(), migration::MigrationAuth{.cluster_token = token,
                                                .by_certificate = tls.mutual});
    cluster::EtcdClient* etcd = member->etcd();
    migration::PeerResolver resolve =
        [etcd](const std::string& id) -> absl::StatusOr<migration::PeerNode> {
      KVD_ASSIGN_OR_RETURN(std::optional<cluster::EtcdKeyValue> kv,
                           etcd->Get(absl::StrCat(cluster::kNodesPrefix, id)));
      if (!kv.has_value()) {
        return absl::NotFoundError(absl::StrCat(
            "node '", id,
            "' is not a live member of the cluster (kvd cluster status "
            "lists them)"));
      }
      KVD_ASSIGN_OR_RETURN(cluster::NodeInfo n,
                           cluster::DecodeNodeInfo(kv->value));
      if (n.grpc_address.empty()) {
        return absl::FailedPreconditionError(
            absl::StrCat("node '", id, "' serves no gRPC API"));
      }
      KVD_ASSIGN_OR_RETURN(std::optional<cluster::EtcdKeyValue> drain,
                           etcd->Get(absl::StrCat(cluster::kDrainPrefix, id)));
      return migration::PeerNode{n.grpc_address, n.model_fingerprint,
                                 drain.has_value()};
    };
    migration::MigratorOptions mo;
    mo.node_id = args.Get("node-id");
    mo.cluster_token = token;
    mo.ca_cert_pem = ca_pem;
    if (tls.mutual) {
      mo.client_cert_pem = tls.cert_pem;
      mo.client_key_pem = tls.key_pem;
    }
    migrator = std::make_shared<migration::Migrator>(
        &rt->engine(), member->directory(), ucx.get(), resolve, mo);
    const migration::PeerOptions peer{
        .cluster_token = token,
        .ca_cert_pem = ca_pem,
        .client_cert_pem = tls.mutual ? tls.cert_pem : "",
        .client_key_pem = tls.mutual ? tls.key_pem : ""};
    replicator = std::make_unique<migration::Replicator>(
        &rt->engine(), etcd, member->directory(), ucx.get(), resolve,
        migration::ReplicatorOptions{
            .node_id = args.Get("node-id"),
            .model_fingerprint = rt->engine().identity().fingerprint(),
            .replicas = static_cast<int>(replicas),
            .sync = replication == "sync",
            .peer = peer});
    replicate->store(replicator.get());
    failover = std::make_unique<migration::FailoverController>(
        etcd, member->directory(),
        [resolve, peer](const std::string& node, const std::string& tenant,
                        const std::string& session)
            -> absl::StatusOr<v1::ReplicaStatusResponse> {
          KVD_ASSIGN_OR_RETURN(migration::PeerNode p, resolve(node));
          return migration::QueryReplica(p, peer, tenant, session);
        },
        migration::FailoverOptions{.node_id = args.Get("node-id")});
  }
  const std::string host = args.Get("host");
  auto metrics = std::make_shared<node::Metrics>();
  // One admission control for both front ends: --max-inflight bounds the
  // node, not each API.
  auto admission = std::make_shared<node::Admission>(static_cast<int>(inflight),
                                                     static_cast<int>(queue));
  std::string metrics_key = args.Get("metrics-key");
  if (metrics_key.empty()) {
    if (const char* env = std::getenv("KVD_METRICS_KEY")) metrics_key = env;
  }
  std::unique_ptr<node::HttpServer> http;
  if (http_port >= 0) {
    node::HttpServerOptions o;
    o.host = host;
    o.port = static_cast<int>(http_port);
    o.max_inflight = static_cast<int>(inflight);
    o.max_queue = static_cast<int>(queue);
    o.threads = static_cast<int>(http_threads);
    o.read_timeout = absl::Seconds(read_timeout_s);
    o.max_connections = static_cast<int>(max_connections);
    o.keys = keys;
    o.metrics = metrics;
    o.admission = admission;
    o.metrics_key = metrics_key;
    o.tls_cert_path = args.Get("tls-cert");
    o.tls_key_path = args.Get("tls-key");
    if (tls.mutual) o.client_ca_path = args.Get("ca-cert");
    o.migrator = migrator;
    if (member) {
      DeclareClusterMetrics(*metrics);
      o.more_metrics = [&](node::Metrics& m) {
        SetClusterMetrics(m, migrator.get(), inbound.get(), replicator.get(),
                          failover.get(), drainer.get());
      };
    }
    KVD_ASSIGN_OR_RETURN(http, node::StartHttpServer(rt.get(), std::move(o)));
  }
  std::unique_ptr<node::GrpcServer> grpc;
  if (grpc_port >= 0) {
    node::GrpcServerOptions o;
    o.address = absl::StrCat(host, ":", grpc_port);
    o.admission = admission;
    o.metrics = metrics;
    o.tls_cert_path = args.Get("tls-cert");
    o.tls_key_path = args.Get("tls-key");
    if (tls.mutual) o.client_ca_path = args.Get("ca-cert");
    o.migrator = migrator;
    if (migration_service) o.extra_services.push_back(migration_service.get());
    KVD_ASSIGN_OR_RETURN(grpc,
                         node::StartGrpcServer(rt.get(), keys, std::move(o)));
  }
  if (member) {
    std::string advertise = args.Get("advertise");
    if (advertise.empty()) advertise = host == "0.0.0.0" ? "127.0.0.1" : host;
    const std::string http_url =
        http ? absl::StrCat(args.Has("tls-cert") ? "https" : "http", "://",
                            advertise, ":", http->port())
             : "";
    const std::string grpc_address =
        grpc ? absl::StrCat(advertise, ":", grpc->port()) : "";
    KVD_RETURN_IF_ERROR(
        member->Join(rt.get(), admission.get(), http_url, grpc_address));
    std::fprintf(stderr,
                 "kvd serve: node '%s' joined the cluster at %s (incarnation "
                 "%s); sessions move over %s\n",
                 args.Get("node-id").c_str(), args.Get("cluster").c_str(),
                 member->incarnation().c_str(), ucx->name().c_str());
    drainer = std::make_unique<migration::Drainer>(
        member->etcd(), member->directory(), migrator.get(),
        migration::DrainerOptions{
            .node_id = args.Get("node-id"),
            .model_fingerprint = rt->engine().identity().fingerprint(),
            .rebalance_every = absl::Seconds(rebalance_s)},
        &rt->engine());
    drainer->Start();
    failover->Start();
  }
  std::fprintf(stderr,
               "kvd serve: model %s (%s) on the %s backend, sessions in "
               "%s/sessions\n",
               rt->model_id().c_str(), rt->model_path().c_str(),
               rt->backend().backend_name(), args.Get("data-dir").c_str());
  if (absl::StatusOr<PrecisionChoice> precision = PrecisionFromFlags(args);
      precision.ok()) {
    std::fprintf(stderr, "  precision   %s\n", precision->why.c_str());
  }
  std::fprintf(stderr, "  policy      %s (%s)\n", rt->policy().Name().c_str(),
               args.Get("policy") == "auto"
                   ? "auto: the planner's choice for this machine, "
                     "docs/PLANNER.md"
                   : "--policy");
  if (http) {
    std::fprintf(stderr, "  OpenAI API  %s://%s:%d/v1  (metrics: /metrics%s)\n",
                 args.Has("tls-cert") ? "https" : "http", host.c_str(),
                 http->port(), metrics_key.empty() ? "" : ", key required");
  }
  if (grpc) {
    std::fprintf(stderr, "  gRPC        %s:%d\n", host.c_str(), grpc->port());
  }
  std::fprintf(stderr, "  %s; Ctrl-C to stop\n",
               keys.trusts_routers()
                   ? "requests only from the cluster's routers"
               : keys.enabled() ? "API keys required"
                                : "no API keys: open node");
  int sig = 0;
  sigwait(&stop, &sig);
  std::fprintf(stderr, "kvd serve: %s, stopping\n",
               sig == SIGINT ? "SIGINT" : "SIGTERM");
  // gRPC first: its generations stop and leave the admission queue the two
  // front ends share, so HTTP requests queued behind them are not kept
  // waiting while HTTP stops.
  if (grpc) grpc->Shutdown();
  if (http) http->Stop();  // after it, nothing reads the parts below
  drainer.reset();         // no new moves; one in progress finishes first
  failover.reset();
  // No turn commits any more: stop replicating (async sends what it holds).
  replicate->store(nullptr);
  replicator.reset();
  inbound.reset();
  // Leave the cluster only once no turn runs: the engine's fence uses the
  // membership until then.
  member.reset();
  return rt->store().Flush();
}

}  // namespace

int ServeCommand(const std::vector<std::string>& argv) {
  Args args("kvd serve",
            "Serves the model to many clients with durable sessions: an "
            "OpenAI-compatible HTTP API (add \"session_id\" to a request to "
            "continue a stored conversation with only the new message) and "
            "gRPC.\nExample: kvd serve --model gemma3 --http-port 8080");
  DeclareFlags(args);
  absl::StatusOr<std::vector<std::string>> config = ConfigArgs(argv);
  if (!config.ok()) {
    std::fprintf(stderr, "kvd serve: %s\n", config.status().ToString().c_str());
    return 2;
  }
  std::vector<std::string> all = *config;
  all.insert(all.end(), argv.begin(), argv.end());
  return args.Main(all, Run);
}

}  // namespace kvd::cli
