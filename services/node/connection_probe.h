// Tells whether the client of an HTTP request is still connected, for a
// request whose handler does not write until it is done (a non-streaming
// generation): cpp-httplib 0.11 (Debian's) gives a handler neither its socket
// nor a "connection closed" flag, so the probe finds the accepted socket by
// the connection's addresses and polls it for the peer's FIN or RST.
//
//   ConnectionProbe probe = ConnectionProbe::Find(
//       req.remote_addr, req.remote_port, req.local_port);
//   generate.cancelled = [&probe] { return probe.PeerClosed(); };
//
// The socket belongs to the HTTP server and stays open until the handler
// returns; the probe never reads, writes or closes it. A peer that only
// shuts down its sending side (half-close) counts as gone: HTTP/1.1 clients
// do not half-close while waiting for a response.
//
// Thread-safety: PeerClosed may be called from any thread (one poll(2)).
#ifndef KVD_SERVICES_NODE_CONNECTION_PROBE_H_
#define KVD_SERVICES_NODE_CONNECTION_PROBE_H_

#include <string>

namespace kvd::node {

class ConnectionProbe {
 public:
  // The connected TCP socket of this process whose peer is
  // remote_addr:remote_port (numeric IPv4 or IPv6, as httplib gives it) and
  // whose local port is `local_port`. Not found (or no such connection): a
  // probe that never reports the peer gone.
  static ConnectionProbe Find(const std::string& remote_addr, int remote_port,
                              int local_port);
  // A probe of a known socket (tests).
  static ConnectionProbe ForSocket(int fd) { return ConnectionProbe(fd); }

  // Whether a socket was found.
  bool valid() const { return fd_ >= 0; }
  // True once the peer closed or reset the connection. Data the client sent
  // after its request (a pipelined request) does not count.
  bool PeerClosed() const;

 private:
  explicit ConnectionProbe(int fd) : fd_(fd) {}
  int fd_ = -1;
};

}  // namespace kvd::node

#endif  // KVD_SERVICES_NODE_CONNECTION_PROBE_H_
