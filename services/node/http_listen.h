// Binds a cpp-httplib server the way kvd's HTTP front ends (node and router)
// need it:
//   - Debian's compiled cpp-httplib listens with a backlog of 5, so a burst
//     of clients connecting at once overflowed it and some requests failed
//     with a read error before reaching a handler (seen with 32 users in the
//     load test, and with 48 through the router): the listening socket is
//     remembered as it is created and listens again with room for SOMAXCONN
//     pending connections;
//   - httplib's default socket options also set SO_REUSEPORT, with which a
//     second process on the same port started without an error and the
//     kernel split the connections between the two; SO_REUSEADDR alone
//     still allows a quick restart past TIME_WAIT.
//
//   KVD_ASSIGN_OR_RETURN(int port, BindHttpServer(server, "127.0.0.1", 0));
//   std::thread([&] { server.listen_after_bind(); });
#ifndef KVD_SERVICES_NODE_HTTP_LISTEN_H_
#define KVD_SERVICES_NODE_HTTP_LISTEN_H_

#include <string>

#include "absl/status/statusor.h"

namespace httplib {
class Server;
}

namespace kvd::node {

// The bound port (`port` 0: one the OS picks). UNAVAILABLE naming the
// address if it cannot be bound.
absl::StatusOr<int> BindHttpServer(httplib::Server& server,
                                   const std::string& host, int port);

}  // namespace kvd::node

#endif  // KVD_SERVICES_NODE_HTTP_LISTEN_H_
