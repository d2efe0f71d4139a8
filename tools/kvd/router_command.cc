// `kvd router`: one address for a cluster (services/router/router.h), until
// SIGINT/SIGTERM.
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "services/node/async_http.h"
#include "services/node/auth.h"
#include "services/router/router.h"
#include "tools/kvd/args.h"
#include "tools/kvd/cluster_endpoint.h"
#include "tools/kvd/cluster_tls.h"
#include "tools/kvd/commands.h"

namespace kvd::cli {
namespace {

absl::Status Run(const Args& args) {
  KVD_ASSIGN_OR_RETURN(int64_t port, args.GetIntIn("port", 0, 65535));
  KVD_ASSIGN_OR_RETURN(int64_t threads, args.GetIntIn("threads", 4, 65536));
  KVD_ASSIGN_OR_RETURN(int64_t grpc_port,
                       args.GetIntIn("grpc-port", -1, 65535));
  router::RouterOptions o;
  o.host = args.Get("host");
  o.port = static_cast<int>(port);
  o.threads = static_cast<int>(threads);
  o.grpc_port = static_cast<int>(grpc_port);
  KVD_ASSIGN_OR_RETURN(o.etcd_endpoint, EtcdEndpoint(args));
  KVD_ASSIGN_OR_RETURN(o.keys, node::KeyStore::Load(args.Get("api-keys")));
  o.router_token = args.Get("router-token");
  if (o.router_token.empty()) {
    if (const char* env = std::getenv("KVD_ROUTER_TOKEN")) o.router_token = env;
  }
  o.ca_cert_path = args.Get("ca-cert");
  o.tls_cert_path = args.Get("tls-cert");
  o.tls_key_path = args.Get("tls-key");
  // Checks the files and what the certificate names (a router's).
  KVD_ASSIGN_OR_RETURN(
      ClusterTls tls,
      LoadClusterTls(o.ca_cert_path, o.tls_cert_path, o.tls_key_path,
                     node::PeerIdentity::Role::kRouter, ""));
  if (absl::StartsWith(o.etcd_endpoint, "https://")) {
    // etcd over TLS: the router's certificate is its etcd user.
    o.etcd_ca_pem = tls.ca_pem;
    o.etcd_cert_pem = tls.cert_pem;
    o.etcd_key_pem = tls.key_pem;
  }
  KVD_ASSIGN_OR_RETURN(o.session_creations_per_minute,
                       args.GetDouble("tenant-sessions-per-minute"));
  KVD_ASSIGN_OR_RETURN(o.migrations_per_minute,
                       args.GetDouble("tenant-migrations-per-minute"));
  node::RaiseOpenFileLimit();  // every open connection is a file descriptor
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  KVD_ASSIGN_OR_RETURN(std::unique_ptr<router::Router> r,
                       router::StartRouter(o));
  std::fprintf(stderr,
               "kvd router: cluster at etcd %s\n  OpenAI API  "
               "http://%s:%d/v1  (metrics: /metrics)\n",
               o.etcd_endpoint.c_str(), o.host.c_str(), r->port());
  if (r->grpc_port() >= 0) {
    std::fprintf(stderr, "  gRPC        %s:%d\n", o.host.c_str(),
                 r->grpc_port());
  }
  std::fprintf(stderr, "  %s; Ctrl-C to stop\n",
               o.keys.enabled() ? "API keys required" : "no API keys: open");
  int sig = 0;
  sigwait(&stop, &sig);
  std::fprintf(stderr, "kvd router: %s, stopping\n",
               sig == SIGINT ? "SIGINT" : "SIGTERM");
  r->Stop();
  return absl::OkStatus();
}

}  // namespace

int RouterCommand(const std::vector<std::string>& argv) {
  Args args("kvd router",
            "One address for a kvd cluster: the nodes' OpenAI-compatible HTTP "
            "API, each session sent to the node that owns it (the etcd "
            "directory), new ones to the least-loaded node serving their "
            "model. Keeps no state of its own: run as many as you like.\n"
            "Example: kvd router --etcd 127.0.0.1:2379 --port 8000 "
            "--router-token $(cat cluster/router-token)");
  args.Flag("host", "127.0.0.1",
            "address to listen on (0.0.0.0 for every interface)");
  args.Flag("port", "8000", "HTTP port (0: the OS picks one)");
  args.Flag("grpc-port", "7000",
            "gRPC (kvd.v1.Sessions) port; 0: the OS picks one; -1: off");
  DeclareEtcdFlag(args);
  args.Flag("api-keys", "",
            "file of '<key> <tenant>' lines (also read: $KVD_API_KEYS as "
            "key:tenant,...); none = open, every request is tenant 'local'");
  args.Flag("router-token", "",
            "the secret the cluster's nodes trust (their --router-token; "
            "also read: $KVD_ROUTER_TOKEN)");
  args.Flag("ca-cert", "",
            "PEM CA of the nodes' certificates, when nodes serve https "
            "(tools/cluster/make_certs.sh)");
  args.Flag("tls-cert", "",
            "PEM certificate naming this router ('router:ID', "
            "tools/cluster/make_certs.sh DIR --router ID), shown to nodes "
            "that require one (mutual TLS) with --tls-key");
  args.Flag("tls-key", "", "PEM private key for --tls-cert");
  args.Flag("tenant-sessions-per-minute", "600",
            "new sessions a tenant may start a minute (a tenth of it at "
            "once); past it 429 with Retry-After; 0: no limit");
  args.Flag("tenant-migrations-per-minute", "60",
            "session migrations a tenant may ask for a minute (a tenth at "
            "once); 0: no limit");
  args.Flag("threads", "256",
            "handler threads; each forwarded request holds one while it runs "
            "(idle connections hold none)");
  return args.Main(argv, Run);
}

}  // namespace kvd::cli
