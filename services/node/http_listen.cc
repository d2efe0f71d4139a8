#include "services/node/http_listen.h"

#include <httplib.h>
#include <sys/socket.h>

#include "absl/strings/str_cat.h"

namespace kvd::node {

absl::StatusOr<int> BindHttpServer(httplib::Server& server,
                                   const std::string& host, int port) {
  int listen_fd = -1;
  server.set_socket_options([&listen_fd](int sock) {
    const int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    if (listen_fd < 0) listen_fd = sock;
  });
  const int bound = port == 0 ? server.bind_to_any_port(host)
                              : (server.bind_to_port(host, port) ? port : -1);
  if (bound <= 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", host, ":", port,
        " (in use, or not an address of this machine); pick another port"));
  }
  if (listen_fd >= 0 && ::listen(listen_fd, SOMAXCONN) != 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot enlarge the listen backlog on ", host, ":", bound));
  }
  return bound;
}

}  // namespace kvd::node
