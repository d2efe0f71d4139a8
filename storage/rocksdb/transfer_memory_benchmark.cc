// Peak memory of moving a session file through a gRPC-style stream of 1 MiB
// messages, the old way (the whole file as one string, then parsed, then
// the chunks copied: what ExportSession / ImportSession did) and the new
// way (WriteSessionPieces / ReadSessionPieces: one message at a time). The
// session is synthetic but SmolLM2-shaped: kv-direct (31 checkpointed
// layers), 1152-byte bf16 rows, 64-token chunks. One measurement per
// process, so VmHWM (peak resident) belongs to it alone:
//
//   bazel build -c opt //storage/rocksdb:transfer_memory_benchmark
//   B=bazel-bin/storage/rocksdb/transfer_memory_benchmark
//   for t in 1024 8192; do for m in buffered pieces; do
//     for op in export import; do $B $t $m $op; done; done; done
//
// Prints: tokens, mode, op, session bytes, RSS before, peak RSS, and the
// peak above the session's own state (which both ways must hold).
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "storage/checkpoint/session_file.h"
#include "storage/rocksdb/session_db_test_util.h"

namespace {

using kvd::storage::SessionCheckpoint;

int64_t StatusKb(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0) return std::atoll(line.c_str() + 7);
  }
  return -1;
}

constexpr size_t kMessageBytes = 1 << 20;

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s TOKENS buffered|pieces export|import\n",
                 argv[0]);
    return 2;
  }
  const int64_t tokens = std::atoll(argv[1]);
  const std::string mode = argv[2], op = argv[3];
  kvd::storage::testing::SyntheticSessionOptions o;
  o.layers.clear();
  for (int64_t l = 0; l <= 30; ++l) o.layers.push_back(l);
  o.chunk_tokens = 64;
  o.row_bytes = 1152;
  kvd::storage::testing::SyntheticSession s(o);
  SessionCheckpoint cp;
  if (!cp.Apply(s.AppendTurn(tokens)).ok()) return 1;

  // What travels: the messages, made up front for an import (the sender's
  // memory, not the receiver's), then dropped one by one as consumed.
  std::vector<std::string> messages;
  if (op == "import") {
    if (!kvd::storage::WriteSessionPieces(cp, kMessageBytes,
                                          [&](absl::string_view p) {
                                            messages.emplace_back(p);
                                            return true;
                                          })
             .ok()) {
      return 1;
    }
    cp = SessionCheckpoint();  // the receiver does not hold the session yet
  }
  const int64_t before_kb = StatusKb("VmRSS:");
  size_t sent = 0;
  if (op == "export" && mode == "buffered") {
    absl::StatusOr<std::string> bytes = kvd::storage::SerializeSessionFile(cp);
    for (size_t at = 0; bytes.ok() && at < bytes->size(); at += kMessageBytes) {
      std::string msg = bytes->substr(at, kMessageBytes);
      sent += msg.size();
    }
  } else if (op == "export") {
    (void)kvd::storage::WriteSessionPieces(cp, kMessageBytes,
                                           [&](absl::string_view p) {
                                             std::string msg(p);
                                             sent += msg.size();
                                             return true;
                                           });
  } else if (mode == "buffered") {
    std::string file;
    for (std::string& m : messages) {
      file += m;
      std::string().swap(m);
    }
    absl::StatusOr<SessionCheckpoint> back =
        kvd::storage::ParseSessionFile(file, "import");
    if (!back.ok()) return 1;
    SessionCheckpoint renamed;
    renamed.Reset(back->manifest(), back->chunks());  // the old copy
    sent = static_cast<size_t>(renamed.bytes());
  } else {
    size_t next = 0;
    absl::StatusOr<SessionCheckpoint> back = kvd::storage::ReadSessionPieces(
        [&](std::string* p) {
          if (next == messages.size()) return false;
          *p = std::move(messages[next]);
          std::string().swap(messages[next++]);
          return true;
        },
        "import");
    if (!back.ok()) return 1;
    back->ReplaceManifest(back->manifest());
    sent = static_cast<size_t>(back->bytes());
  }
  const int64_t peak_kb = StatusKb("VmHWM:");
  const double session_mib =
      static_cast<double>(cp.bytes() > 0 ? cp.bytes()
                                         : static_cast<int64_t>(sent)) /
      (1 << 20);
  std::printf(
      "%6lld tokens  %-8s %-6s  session %7.1f MiB  rss before %7.1f MiB"
      "  peak %7.1f MiB  peak - before %7.1f MiB\n",
      static_cast<long long>(tokens), mode.c_str(), op.c_str(), session_mib,
      before_kb / 1024.0, peak_kb / 1024.0, (peak_kb - before_kb) / 1024.0);
  return 0;
}
