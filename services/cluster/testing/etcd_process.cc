#include "services/cluster/testing/etcd_process.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "services/cluster/etcd_client.h"

namespace kvd::cluster::testing {
namespace {

// A port the kernel says is free now (another process may still take it
// before etcd binds it; Start retries).
int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

std::string EtcdBinary() {
  for (const char* p : {"/usr/bin/etcd", "/usr/local/bin/etcd"}) {
    if (::access(p, X_OK) == 0) return p;
  }
  return "";
}

}  // namespace

absl::StatusOr<std::unique_ptr<EtcdProcess>> EtcdProcess::Start(
    const std::string& dir) {
  return Start(dir, Tls());
}

absl::StatusOr<std::unique_ptr<EtcdProcess>> EtcdProcess::Start(
    const std::string& dir, const Tls& tls) {
  const bool secure = !tls.cert_file.empty();
  EtcdClientOptions probe;
  if (secure) {
    auto read = [](const std::string& path) {
      std::ifstream in(path);
      std::stringstream text;
      text << in.rdbuf();
      return text.str();
    };
    probe.ca_pem = read(tls.ca_file);
    probe.cert_pem = read(tls.client_cert_file);
    probe.key_pem = read(tls.client_key_file);
  }
  const std::string binary = EtcdBinary();
  if (binary.empty()) {
    return absl::FailedPreconditionError(
        "etcd is not installed; run tools/setup.sh --test (Debian's "
        "etcd-server)");
  }
  for (int attempt = 0; attempt < 3; ++attempt) {
    const int client = FreePort(), peer = FreePort();
    const std::string data = absl::StrCat(dir, "/etcd-", attempt);
    std::filesystem::remove_all(data);
    const std::string client_url =
        absl::StrCat(secure ? "https" : "http", "://127.0.0.1:", client);
    const std::string peer_url = absl::StrCat("http://127.0.0.1:", peer);
    std::vector<std::string> args = {
        binary,
        "--name=kvd-test",
        "--data-dir=" + data,
        "--listen-client-urls=" + client_url,
        "--advertise-client-urls=" + client_url,
        "--listen-peer-urls=" + peer_url,
        "--initial-advertise-peer-urls=" + peer_url,
        "--initial-cluster=kvd-test=" + peer_url,
        "--log-level=error",
        "--logger=zap"};
    if (secure) {
      args.push_back("--cert-file=" + tls.cert_file);
      args.push_back("--key-file=" + tls.key_file);
      args.push_back("--trusted-ca-file=" + tls.ca_file);
      args.push_back("--client-cert-auth");
    }
    std::unique_ptr<EtcdProcess> etcd(new EtcdProcess());
    etcd->endpoint_ =
        absl::StrCat(secure ? "https://" : "", "127.0.0.1:", client);
    etcd->data_dir_ = data;
    etcd->pid_ = ::fork();
    if (etcd->pid_ == 0) {
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(binary.c_str(), argv.data());
      ::_exit(127);
    }
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (absl::Now() < deadline) {
      int status = 0;
      if (::waitpid(etcd->pid_, &status, WNOHANG) == etcd->pid_) {
        etcd->pid_ = -1;  // exited: a port was taken; try others
        break;
      }
      probe.endpoint = etcd->endpoint_;
      probe.timeout = absl::Milliseconds(500);
      if (EtcdClient::Connect(probe).ok()) {
        return etcd;
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
  }
  return absl::UnavailableError(
      absl::StrCat("etcd did not start and answer under ", dir));
}

EtcdProcess::~EtcdProcess() {
  if (pid_ > 0) {
    ::kill(pid_, SIGTERM);
    bool exited = false;
    for (int i = 0; i < 100 && !exited; ++i) {
      exited = ::waitpid(pid_, nullptr, WNOHANG) == pid_;
      if (!exited) absl::SleepFor(absl::Milliseconds(50));
    }
    if (!exited) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  // Its write-ahead log preallocates 64 MB, and the sandboxes here keep
  // TEST_TMPDIR after a test ends.
  std::error_code ignored;
  if (!data_dir_.empty()) std::filesystem::remove_all(data_dir_, ignored);
}

}  // namespace kvd::cluster::testing
