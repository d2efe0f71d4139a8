#include "services/node/connection_probe.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cstdlib>
#include <cstring>

namespace kvd::node {
namespace {

// Port and address of `sa` compared with a numeric address and a port;
// IPv4-mapped IPv6 peers match their IPv4 form.
bool SameEndpoint(const sockaddr_storage& sa, const std::string& addr,
                  int port) {
  if (sa.ss_family == AF_INET) {
    const auto& in = reinterpret_cast<const sockaddr_in&>(sa);
    if (ntohs(in.sin_port) != port) return false;
    in_addr want;
    if (inet_pton(AF_INET, addr.c_str(), &want) == 1) {
      return want.s_addr == in.sin_addr.s_addr;
    }
    return false;
  }
  if (sa.ss_family == AF_INET6) {
    const auto& in6 = reinterpret_cast<const sockaddr_in6&>(sa);
    if (ntohs(in6.sin6_port) != port) return false;
    in6_addr want;
    if (inet_pton(AF_INET6, addr.c_str(), &want) == 1) {
      return std::memcmp(&want, &in6.sin6_addr, sizeof(want)) == 0;
    }
    in_addr want4;
    if (IN6_IS_ADDR_V4MAPPED(&in6.sin6_addr) &&
        inet_pton(AF_INET, addr.c_str(), &want4) == 1) {
      return std::memcmp(&want4, &in6.sin6_addr.s6_addr[12], 4) == 0;
    }
  }
  return false;
}

int LocalPort(int fd) {
  sockaddr_storage sa{};
  socklen_t len = sizeof(sa);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) return -1;
  if (sa.ss_family == AF_INET) {
    return ntohs(reinterpret_cast<const sockaddr_in&>(sa).sin_port);
  }
  if (sa.ss_family == AF_INET6) {
    return ntohs(reinterpret_cast<const sockaddr_in6&>(sa).sin6_port);
  }
  return -1;
}

}  // namespace

ConnectionProbe ConnectionProbe::Find(const std::string& remote_addr,
                                      int remote_port, int local_port) {
  if (remote_port <= 0 || local_port <= 0) return ConnectionProbe(-1);
  // Only the process's open descriptors; a listening socket has no peer.
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return ConnectionProbe(-1);
  const int dir_fd = dirfd(dir);
  int found = -1;
  while (dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == dir_fd) continue;
    struct stat st;
    if (fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) {
      continue;
    }
    sockaddr_storage peer{};
    socklen_t len = sizeof(peer);
    if (getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer),
                    &len) != 0) {
      continue;
    }
    if (SameEndpoint(peer, remote_addr, remote_port) &&
        LocalPort(static_cast<int>(fd)) == local_port) {
      found = static_cast<int>(fd);
      break;
    }
  }
  closedir(dir);
  return ConnectionProbe(found);
}

bool ConnectionProbe::PeerClosed() const {
  if (fd_ < 0) return false;
  pollfd p{fd_, POLLIN | POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

}  // namespace kvd::node
