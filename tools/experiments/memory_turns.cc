// Memory over a 20-turn conversation (the KV-Direct paper's peak-memory
// experiment): each turn feeds a user message of 30-60 text tokens in the
// model's ChatML framing, then greedily decodes --gen tokens; after every
// turn it writes one CSV row: tokens so far, K/V cache allocated bytes
// (KvCache::allocated_bytes; kv_used_bytes: size_bytes, the rows held),
// residual store bytes, their sum, and the
// process's VmRSS / VmHWM from /proc/self/status.
//
// One policy per process, so VmHWM is that policy's peak (it includes the
// model weights and the binary; the cache bytes are the primary metric):
//
//   bazel build //tools/experiments:memory_turns
//   bazel-bin/tools/experiments/memory_turns --policy=kv
//       --csv=/tmp/mt_kv.csv --tokens_out=/tmp/mt_kv.tokens
//   bazel-bin/tools/experiments/memory_turns --policy=kv-direct --budget=256
//       --csv=/tmp/mt_kvd.csv --reference=/tmp/mt_kv.tokens
//
// With --reference (the kv run's --tokens_out), every turn's greedy tokens
// must equal the reference's: a difference is printed and the run fails (exit
// 2). plot_memory_turns.py turns the two CSVs into a table and a plot.
//
// Flags (--name=value or --name value; --help lists them): --model (default the
// cached SmolLM2-135M-Instruct; the turn framing is ChatML, which SmolLM2
// uses), --precision (bf16|fp32, default bf16), --policy (kv|kv-direct),
// --budget (256; kv-direct's hot window), --turns (20), --gen (40), --prompts
// (text source, default tools/experiments/prompts/conversations.json),
// --threads (2), --csv,
// --tokens_out, --reference.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/model_dir.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"
#include "ops/kvdirect/checkpoint_policy.h"
#include "ops/kvdirect/residual_kv_source.h"
#include "ops/kvdirect/residual_store.h"
#include "ops/model/model.h"
#include "ops/tokenizer/gguf_tokenizer.h"
#include "tools/kvd/args.h"

namespace kvd {
namespace {

struct Flags {
  std::string model = CachedModelPath("SmolLM2-135M-Instruct.Q4_1.gguf");
  std::string precision = "bf16";
  std::string policy = "kv";
  int64_t budget = 256;
  int64_t turns = 20;
  int64_t gen = 40;
  std::string prompts = "tools/experiments/prompts/conversations.json";
  int threads = 2;
  std::string csv, tokens_out, reference;
};

absl::StatusOr<Flags> ParseFlags(int argc, char** argv) {
  Flags f;
  cli::Args a(
      "memory_turns",
      "Cache bytes per turn of a 20-turn conversation (see the header).");
  a.Flag("model", f.model, "GGUF file (the turn framing is ChatML)");
  a.Flag("precision", f.precision, "bf16 or fp32");
  a.Flag("policy", f.policy, "kv or kv-direct");
  a.Flag("budget", std::to_string(f.budget),
         "kv-direct's hot window (positions)");
  a.Flag("turns", std::to_string(f.turns), "conversation turns");
  a.Flag("gen", std::to_string(f.gen), "greedy tokens per turn");
  a.Flag("prompts", f.prompts, "JSON file with the user messages' text");
  a.Flag("threads", std::to_string(f.threads), "worker threads");
  a.Flag("csv", "", "write one row per turn here");
  a.Flag("tokens_out", "", "write the greedy tokens here");
  a.Flag("reference", "", "fail unless the greedy tokens equal this file's");
  KVD_RETURN_IF_ERROR(a.Parse(std::vector<std::string>(argv + 1, argv + argc)));
  if (a.help_requested()) {
    std::fputs(a.Help().c_str(), stdout);
    std::exit(0);
  }
  f.model = a.Get("model");
  f.precision = a.Get("precision");
  f.policy = a.Get("policy");
  f.prompts = a.Get("prompts");
  f.csv = a.Get("csv");
  f.tokens_out = a.Get("tokens_out");
  f.reference = a.Get("reference");
  KVD_ASSIGN_OR_RETURN(f.budget, a.GetInt("budget"));
  KVD_ASSIGN_OR_RETURN(f.turns, a.GetInt("turns"));
  KVD_ASSIGN_OR_RETURN(f.gen, a.GetInt("gen"));
  KVD_ASSIGN_OR_RETURN(int64_t threads, a.GetInt("threads"));
  f.threads = static_cast<int>(threads);
  if (f.budget < 0 || f.turns < 0 || f.gen < 0) {
    return absl::InvalidArgumentError(
        "--budget, --turns and --gen must be >= 0");
  }
  if (f.precision != "bf16" && f.precision != "fp32") {
    return absl::InvalidArgumentError("--precision must be fp32 or bf16");
  }
  if (f.policy != "kv" && f.policy != "kv-direct") {
    return absl::InvalidArgumentError("--policy must be kv or kv-direct");
  }
  if (f.gen < 1) return absl::InvalidArgumentError("--gen must be >= 1");
  return f;
}

// The user messages' text of every conversation in the prompts file, joined:
// the source the turns' user messages are cut from.
absl::StatusOr<std::string> ReadPromptText(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot open prompts file ", path,
                     "; run from the repository root or pass --prompts"));
  }
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (!j.is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": expected a JSON array of conversations"));
  }
  std::string text;
  for (const nlohmann::json& c : j) {
    if (!c.contains("messages") || !c["messages"].is_array()) continue;
    for (const nlohmann::json& m : c["messages"]) {
      if (m.value("role", std::string()) != "user") continue;
      absl::StrAppend(&text, m.value("content", std::string()), "\n");
    }
  }
  if (text.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": no user messages to cut turns from"));
  }
  return text;
}

// VmRSS and VmHWM of this process in bytes (0 if /proc is unavailable).
struct ProcMemory {
  int64_t rss = 0, hwm = 0;
};

ProcMemory ReadProcMemory() {
  ProcMemory m;
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    int64_t kb = 0;
    auto parse = [&](const char* key, int64_t* out) {
      if (line.rfind(key, 0) != 0) return;
      std::istringstream s(line.substr(std::string(key).size()));
      if (s >> kb) *out = kb * 1024;
    };
    parse("VmRSS:", &m.rss);
    parse("VmHWM:", &m.hwm);
  }
  return m;
}

int32_t Argmax(const float* logits, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return static_cast<int32_t>(best);
}

// Reference tokens: one line per turn, space-separated ids.
absl::StatusOr<std::vector<std::vector<int32_t>>> ReadTokens(
    const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(
        "cannot open reference tokens ", path,
        "; write them first with --policy=kv --tokens_out=", path));
  }
  std::vector<std::vector<int32_t>> out;
  std::string line;
  while (std::getline(in, line)) {
    std::vector<int32_t> ids;
    for (absl::string_view part :
         absl::StrSplit(line, ' ', absl::SkipEmpty())) {
      int32_t id;
      if (!absl::SimpleAtoi(part, &id)) {
        return absl::InvalidArgumentError(absl::StrCat(
            path, ": '", std::string(part), "' is not a token id"));
      }
      ids.push_back(id);
    }
    out.push_back(std::move(ids));
  }
  return out;
}

absl::Status Run(const Flags& flags) {
  if (const char* ws = std::getenv("BUILD_WORKSPACE_DIRECTORY")) {
    // Under `bazel run` relative paths mean the repository.
    if (chdir(ws) != 0) return absl::InternalError("chdir failed");
  }
  std::vector<std::vector<int32_t>> reference;
  if (!flags.reference.empty()) {
    KVD_ASSIGN_OR_RETURN(reference, ReadTokens(flags.reference));
  }
  KVD_ASSIGN_OR_RETURN(std::string text, ReadPromptText(flags.prompts));
  ops::LoadOptions load;
  load.precision =
      flags.precision == "bf16" ? ops::Precision::kBf16 : ops::Precision::kF32;
  load.num_threads = flags.threads;
  KVD_ASSIGN_OR_RETURN(std::unique_ptr<ops::Model> model,
                       ops::Model::Load(flags.model, load));
  KVD_ASSIGN_OR_RETURN(std::unique_ptr<ops::Tokenizer> tokenizer,
                       ops::TokenizerFromGguf(model->file()));
  const std::vector<int32_t> text_ids =
      tokenizer->Encode(text, /*add_special=*/false, /*parse_special=*/false);
  const ProcMemory loaded = ReadProcMemory();

  const bool direct = flags.policy == "kv-direct";
  KVD_ASSIGN_OR_RETURN(ops::CheckpointPolicy policy,
                       ops::ParseCheckpointPolicy(flags.policy));
  ops::ResidualStore store(
      model->config(), model->precision(),
      ops::CheckpointLayers(policy, model->config().n_layers));
  ops::ResidualKvSource source(&store, /*sequence_id=*/0, flags.budget);
  ops::KvCache cache = model->NewCache();
  ops::ForwardOutput out;
  auto forward = [&](const std::vector<int32_t>& tokens) -> absl::Status {
    ops::SequenceStep step{&cache, tokens, ops::LogitsMode::kLast, 0,
                           direct ? &source : nullptr};
    KVD_RETURN_IF_ERROR(
        model->Forward({&step, 1}, &out, direct ? &store : nullptr));
    return store.status();
  };

  std::ostringstream csv, tokens_out;
  csv << "policy,budget,precision,turn,user_tokens,tokens,kv_bytes,kv_used_"
         "bytes,"
         "residual_bytes,total_bytes,vm_rss,vm_hwm,seconds\n";
  std::fprintf(
      stderr, "%s: %s, %s; after load VmRSS %.1f MiB, VmHWM %.1f MiB\n",
      flags.policy.c_str(), flags.model.c_str(), flags.precision.c_str(),
      loaded.rss / 1048576.0, loaded.hwm / 1048576.0);
  size_t text_pos = 0;
  std::optional<int32_t> pending;  // last turn's final token, not yet fed
  const auto start = std::chrono::steady_clock::now();
  for (int64_t turn = 0; turn < flags.turns; ++turn) {
    // Deterministic lengths spread over 30-60 text tokens.
    const size_t n_user = 30 + (turn * 17) % 31;
    if (text_pos + n_user > text_ids.size()) text_pos = 0;
    std::vector<int32_t> input;
    if (pending) input.push_back(*pending);
    const std::string open =
        absl::StrCat(turn == 0 ? "" : "<|im_end|>\n", "<|im_start|>user\n");
    for (int32_t id : tokenizer->Encode(open, false, true)) input.push_back(id);
    input.insert(input.end(), text_ids.begin() + text_pos,
                 text_ids.begin() + text_pos + n_user);
    text_pos += n_user;
    for (int32_t id :
         tokenizer->Encode("<|im_end|>\n<|im_start|>assistant\n", false, true))
      input.push_back(id);
    const int64_t user_tokens = input.size();

    // Greedy decoding; the turn's last token is fed with the next turn.
    std::vector<int32_t> generated;
    KVD_RETURN_IF_ERROR(forward(input));
    generated.push_back(Argmax(out.Logits(0), out.vocab_size));
    while (static_cast<int64_t>(generated.size()) < flags.gen) {
      KVD_RETURN_IF_ERROR(forward({generated.back()}));
      generated.push_back(Argmax(out.Logits(0), out.vocab_size));
    }
    pending = generated.back();

    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    const ProcMemory mem = ReadProcMemory();
    const int64_t kv_bytes = cache.allocated_bytes();
    const int64_t residual_bytes = direct ? store.size_bytes() : 0;
    csv << absl::StrFormat(
        "%s,%d,%s,%d,%d,%d,%d,%d,%d,%d,%d,%d,%.2f\n", flags.policy,
        direct ? flags.budget : -1, flags.precision, turn + 1, user_tokens,
        cache.length(), kv_bytes, static_cast<int64_t>(cache.size_bytes()),
        residual_bytes, kv_bytes + residual_bytes, mem.rss, mem.hwm, seconds);
    tokens_out << absl::StrJoin(generated, " ") << "\n";
    std::fprintf(
        stderr,
        "turn %2lld: %5lld tokens, K/V %8.2f MiB, residuals %8.2f "
        "MiB, VmRSS %7.1f MiB, VmHWM %7.1f MiB (%.1f s) %s\n",
        static_cast<long long>(turn + 1),
        static_cast<long long>(cache.length()), kv_bytes / 1048576.0,
        residual_bytes / 1048576.0, mem.rss / 1048576.0, mem.hwm / 1048576.0,
        seconds,
        absl::CEscape(tokenizer->Decode(generated)).substr(0, 60).c_str());
    if (!reference.empty()) {
      if (turn >= static_cast<int64_t>(reference.size()) ||
          reference[turn] != generated) {
        std::fprintf(stderr,
                     "MISMATCH at turn %lld: %s greedy tokens differ from the "
                     "reference %s\n  got:       %s\n  reference: %s\n",
                     static_cast<long long>(turn + 1), flags.policy.c_str(),
                     flags.reference.c_str(),
                     absl::StrJoin(generated, " ").c_str(),
                     turn < static_cast<int64_t>(reference.size())
                         ? absl::StrJoin(reference[turn], " ").c_str()
                         : "(none)");
        return absl::DataLossError(absl::StrCat(
            "greedy tokens differ from the reference at turn ", turn + 1));
      }
    }
  }
  if (!reference.empty()) {
    std::fprintf(stderr,
                 "all %lld turns' greedy tokens equal the reference's\n",
                 static_cast<long long>(flags.turns));
  }
  if (!flags.csv.empty()) std::ofstream(flags.csv) << csv.str();
  if (!flags.tokens_out.empty())
    std::ofstream(flags.tokens_out) << tokens_out.str();
  std::cout << csv.str();
  return absl::OkStatus();
}

}  // namespace
}  // namespace kvd

int main(int argc, char** argv) {
  absl::StatusOr<kvd::Flags> flags = kvd::ParseFlags(argc, argv);
  absl::Status s = flags.ok() ? kvd::Run(*flags) : flags.status();
  if (!s.ok()) {
    std::cerr << "memory_turns: " << s << "\n";
    return absl::IsDataLoss(s) ? 2 : 1;
  }
  return 0;
}
