// Test-only: a node's migration side served for its peers, as `kvd serve
// --cluster` does: the engine's inbound transfers (inbound.h) behind
// kvd.v1.Migration (migration_service.h) on a gRPC port of 127.0.0.1 the OS
// picks. What the migration tests, the replication tests and the migration
// benchmark each start per node.
//
//   std::unique_ptr<ServedMigration> m = ServeMigration(engine, &plane, {},
//                                                       "cluster-token");
//   PeerNode{m->address, fingerprint}
#ifndef KVD_SERVICES_MIGRATION_TESTING_SERVED_MIGRATION_H_
#define KVD_SERVICES_MIGRATION_TESTING_SERVED_MIGRATION_H_

#include <memory>
#include <string>

#include "grpcpp/grpcpp.h"
#include "services/engine/session_engine.h"
#include "services/migration/inbound.h"
#include "services/migration/migration_service.h"
#include "services/transport/chunk_stream.h"

namespace kvd::migration::testing {

struct ServedMigration {
  std::unique_ptr<InboundTransfers> inbound;
  std::unique_ptr<MigrationService> service;
  std::unique_ptr<grpc::Server> server;
  std::string address;  // 127.0.0.1:PORT
  // The server stops first: no call reaches a service being destroyed.
  ~ServedMigration() {
    if (server) server->Shutdown();
  }
};

// `engine` and `plane` outlive the result. `max_message_bytes` > 0 raises
// gRPC's receive limit (a benchmark's whole-session pieces).
std::unique_ptr<ServedMigration> ServeMigration(engine::SessionEngine* engine,
                                                transport::Transport* plane,
                                                InboundOptions options,
                                                const std::string& token,
                                                int max_message_bytes = 0);
// The same, authorizing callers by `auth` on a port with `credentials`
// (e.g. TLS that verifies client certificates).
std::unique_ptr<ServedMigration> ServeMigration(
    engine::SessionEngine* engine, transport::Transport* plane,
    InboundOptions options, MigrationAuth auth,
    std::shared_ptr<grpc::ServerCredentials> credentials,
    int max_message_bytes = 0);

}  // namespace kvd::migration::testing

#endif  // KVD_SERVICES_MIGRATION_TESTING_SERVED_MIGRATION_H_
