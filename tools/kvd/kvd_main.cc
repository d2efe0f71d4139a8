// kvd: stateful LLM inference over residual-stream checkpoints. Entry point of
// the CLI.
#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "tools/kvd/commands.h"

namespace {

constexpr char kUsage[] =
    "usage: kvd <command> [flags]\n"
    "\n"
    "commands:\n"
    "  serve      serve the model over an OpenAI-compatible HTTP API and "
    "gRPC,\n"
    "             with durable sessions\n"
    "  router     one address for a cluster of 'kvd serve --cluster' nodes\n"
    "  cluster    a cluster's nodes, load and sessions; drain a node\n"
    "  chat       chat in a durable session: every turn is committed to disk\n"
    "             and the conversation resumes bit-identically later\n"
    "  sessions   list, show, delete, export and import stored sessions\n"
    "  generate   generate text (a chat reply by default) with a local model\n"
    "  bench      measure prefill/decode speed and memory of the CPU engine\n"
    "             ('kvd bench serve': load-test a running server)\n"
    "  plan       estimate (and measure) K/V rebuild time per checkpoint "
    "policy\n"
    "  worker     one CPU tensor-parallel shard (started by 'kvd serve\n"
    "             --tensor-parallel-size N --backend cpu')\n"
    "\n"
    "Run 'kvd <command> --help' for the flags of a command.\n";

}  // namespace

int main(int argc, char** argv) {
  // A peer that vanishes mid-write (a node killed while the router forwards
  // to it over TLS, a client that hangs up) must cost one request an EPIPE,
  // not the whole process a SIGPIPE: OpenSSL and cpp-httplib write to
  // sockets without MSG_NOSIGNAL. chaos_test once lost its router so.
  std::signal(SIGPIPE, SIG_IGN);
  if (argc < 2 || !std::strcmp(argv[1], "--help") ||
      !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "help")) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  const std::vector<std::string> args(argv + 2, argv + argc);
  if (command == "generate") return kvd::cli::GenerateCommand(args);
  if (command == "bench" && !args.empty() && args[0] == "serve") {
    return kvd::cli::BenchServeCommand({args.begin() + 1, args.end()});
  }
  if (command == "bench") return kvd::cli::BenchCommand(args);
  if (command == "plan") return kvd::cli::PlanCommand(args);
  if (command == "chat") return kvd::cli::ChatCommand(args);
  if (command == "serve") return kvd::cli::ServeCommand(args);
  if (command == "router") return kvd::cli::RouterCommand(args);
  if (command == "cluster") return kvd::cli::ClusterCommand(args);
  if (command == "sessions") return kvd::cli::SessionsCommand(args);
  if (command == "worker") return kvd::cli::WorkerCommand(args);
  std::fprintf(stderr, "kvd: unknown command '%s'\n\n%s", command.c_str(),
               kUsage);
  return 2;
}
