// ConnectionProbe over real loopback TCP connections: it finds the accepted
// socket by the connection's addresses (not the client's end, which lives in
// the same process), ignores pipelined data, and sees a close and a reset.
#include "services/node/connection_probe.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gtest/gtest.h"

namespace kvd::node {
namespace {

int Port(int fd, bool peer) {
  sockaddr_in sa{};
  socklen_t len = sizeof(sa);
  if (peer) {
    getpeername(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  } else {
    getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  }
  return ntohs(sa.sin_port);
}

// A listening socket and one accepted connection on 127.0.0.1.
struct Connection {
  int listener = -1, client = -1, server = -1;
  Connection() {
    listener = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(listener, reinterpret_cast<sockaddr*>(&sa), sizeof(sa));
    listen(listener, 4);
    socklen_t len = sizeof(sa);
    getsockname(listener, reinterpret_cast<sockaddr*>(&sa), &len);
    client = socket(AF_INET, SOCK_STREAM, 0);
    connect(client, reinterpret_cast<sockaddr*>(&sa), sizeof(sa));
    server = accept(listener, nullptr, nullptr);
  }
  ~Connection() {
    for (int fd : {listener, client, server}) {
      if (fd >= 0) close(fd);
    }
  }
  ConnectionProbe Probe() const {
    return ConnectionProbe::Find("127.0.0.1", Port(client, false),
                                 Port(listener, false));
  }
};

TEST(ConnectionProbeTest, FindsTheAcceptedSocket) {
  Connection c;
  ASSERT_GE(c.server, 0);
  const ConnectionProbe probe = c.Probe();
  ASSERT_TRUE(probe.valid());
  EXPECT_FALSE(probe.PeerClosed());
  // The found socket is the server's end, not the client's (which is in
  // this process too): when the client shuts down its sending side, only
  // the server's end sees the FIN.
  ASSERT_EQ(shutdown(c.client, SHUT_WR), 0);
  usleep(20000);
  EXPECT_TRUE(probe.PeerClosed());
  EXPECT_FALSE(ConnectionProbe::ForSocket(c.client).PeerClosed());
}

TEST(ConnectionProbeTest, PipelinedDataIsNotAClose) {
  Connection c;
  const ConnectionProbe probe = c.Probe();
  ASSERT_TRUE(probe.valid());
  ASSERT_EQ(write(c.client, "GET / HTTP/1.1\r\n\r\n", 18), 18);
  usleep(20000);
  EXPECT_FALSE(probe.PeerClosed());
}

TEST(ConnectionProbeTest, SeesCloseAndReset) {
  {
    Connection c;
    const ConnectionProbe probe = c.Probe();
    ASSERT_TRUE(probe.valid());
    close(c.client);
    c.client = -1;
    usleep(20000);
    EXPECT_TRUE(probe.PeerClosed());
  }
  {
    Connection c;
    const ConnectionProbe probe = c.Probe();
    ASSERT_TRUE(probe.valid());
    linger l{1, 0};  // close with RST
    setsockopt(c.client, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
    close(c.client);
    c.client = -1;
    usleep(20000);
    EXPECT_TRUE(probe.PeerClosed());
  }
}

TEST(ConnectionProbeTest, UnknownConnectionNeverReportsClosed) {
  Connection c;
  const ConnectionProbe probe =
      ConnectionProbe::Find("127.0.0.1", 1, Port(c.listener, false));
  EXPECT_FALSE(probe.valid());
  EXPECT_FALSE(probe.PeerClosed());
  EXPECT_FALSE(ConnectionProbe::Find("not an address", 5, 6).valid());
}

}  // namespace
}  // namespace kvd::node
