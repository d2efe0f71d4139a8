#include "services/migration/testing/served_migration.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace kvd::migration::testing {

std::unique_ptr<ServedMigration> ServeMigration(engine::SessionEngine* engine,
                                                transport::Transport* plane,
                                                InboundOptions options,
                                                const std::string& token,
                                                int max_message_bytes) {
  return ServeMigration(engine, plane, std::move(options),
                        MigrationAuth{.cluster_token = token},
                        grpc::InsecureServerCredentials(), max_message_bytes);
}

std::unique_ptr<ServedMigration> ServeMigration(
    engine::SessionEngine* engine, transport::Transport* plane,
    InboundOptions options, MigrationAuth auth,
    std::shared_ptr<grpc::ServerCredentials> credentials,
    int max_message_bytes) {
  auto m = std::make_unique<ServedMigration>();
  m->inbound =
      std::make_unique<InboundTransfers>(engine, plane, std::move(options));
  m->service =
      std::make_unique<MigrationService>(m->inbound.get(), std::move(auth));
  grpc::ServerBuilder b;
  int port = 0;
  b.AddListeningPort("127.0.0.1:0", credentials, &port);
  if (max_message_bytes > 0) b.SetMaxReceiveMessageSize(max_message_bytes);
  b.RegisterService(m->service.get());
  m->server = b.BuildAndStart();
  m->address = absl::StrCat("127.0.0.1:", port);
  return m;
}

}  // namespace kvd::migration::testing
