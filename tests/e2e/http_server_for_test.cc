// Starts the OpenAI-compatible HTTP server on 127.0.0.1 (port 0) over a
// model, prints "PORT <n>" on stdout, and serves until stdin closes. For
// end-to-end tests until `kvd serve` wires the server in.
//
//   http_server_for_test --model=SmolLM2-135M-Instruct.Q4_1.gguf
//       --data_dir=/tmp/d [--keys=key:tenant,...] [--max_inflight=2]
//
// --model is a path, or a file name in the model cache (base/model_dir.h).
#include <iostream>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "base/model_dir.h"
#include "services/node/http_server.h"
#include "services/node/runtime.h"

namespace {

std::string Flag(int argc, char** argv, const std::string& name,
                 const std::string& fallback) {
  const std::string prefix = "--" + name + "=";
  for (int i = 1; i < argc; ++i) {
    if (absl::StartsWith(argv[i], prefix)) {
      return std::string(argv[i]).substr(prefix.size());
    }
  }
  return fallback;
}

int Fail(const absl::Status& s) {
  std::cerr << "http_server_for_test: " << s << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model = Flag(argc, argv, "model", "");
  if (!model.empty() && model.find('/') == std::string::npos) {
    model = kvd::CachedModelPath(model);
  }
  kvd::node::NodeOptions options;
  options.model_path = model;
  options.data_dir = Flag(argc, argv, "data_dir", "");
  options.num_threads = 2;
  options.memory_commits = true;
  auto runtime = kvd::node::NodeRuntime::Open(options, nullptr);
  if (!runtime.ok()) return Fail(runtime.status());

  kvd::node::HttpServerOptions http;
  if (!absl::SimpleAtoi(Flag(argc, argv, "max_inflight", "2"),
                        &http.max_inflight)) {
    return Fail(absl::InvalidArgumentError("--max_inflight: not an integer"));
  }
  const std::string keys = Flag(argc, argv, "keys", "");
  if (!keys.empty()) {
    auto store = kvd::node::KeyStore::FromEnvValue(keys);
    if (!store.ok()) return Fail(store.status());
    http.keys = *std::move(store);
  }
  auto server = kvd::node::StartHttpServer(runtime->get(), std::move(http));
  if (!server.ok()) return Fail(server.status());
  std::cout << "PORT " << (*server)->port() << std::endl;
  std::string line;
  while (std::getline(std::cin, line)) {
  }
  (*server)->Stop();
  return 0;
}
