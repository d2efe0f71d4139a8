// Token match and KL of K/V budget policies against the full cache (the
// KV-Direct paper's experiment; tools/experiments/experiment.h describes the
// protocol). For each model and each multi-turn conversation of the prompts
// file, rendered with the model's chat template, it runs every policy at
// every budget and writes one CSV row per (model, prompt, policy, budget) and
// a Markdown summary (match % and mean KL per policy and budget, pooled over
// the prompts' steps). With --free_running each policy decodes on its own
// tokens and the summary gives match % and the mean identical prefix.
//
//   bazel run //tools/experiments:token_match -- --csv=/tmp/tm.csv
//       --markdown=/tmp/tm.md
//
// Flags (--name=value): --models (comma-separated GGUF paths; default the two
// cached real models), --precision (fp32|bf16, default bf16), --prompts
// (default tools/experiments/prompts/conversations.json), --max_prompts,
// --steps (32), --budgets (64,128,256,512,1024), --policies (all six),
// --threads (2), --free_running, --csv, --markdown.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/model_dir.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"
#include "ops/chat/chat_template.h"
#include "ops/model/model.h"
#include "ops/tokenizer/gguf_tokenizer.h"
#include "tools/experiments/experiment.h"
#include "tools/kvd/args.h"

namespace kvd {
namespace {

struct Flags {
  std::vector<std::string> models = {
      CachedModelPath("SmolLM2-135M-Instruct.Q4_1.gguf"),
      CachedModelPath("gemma-3-270m-q4_k_m.gguf")};
  std::string precision = "bf16";
  std::string prompts = "tools/experiments/prompts/conversations.json";
  int64_t max_prompts = 1000;
  int threads = 2;
  std::string csv, markdown;
  experiments::TokenMatchOptions options;
};

absl::StatusOr<std::vector<int64_t>> ParseInts(const std::string& s) {
  std::vector<int64_t> out;
  for (absl::string_view part : absl::StrSplit(s, ',')) {
    int64_t v;
    if (!absl::SimpleAtoi(part, &v)) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", std::string(part), "' is not an integer"));
    }
    out.push_back(v);
  }
  return out;
}

absl::StatusOr<Flags> ParseFlags(int argc, char** argv) {
  Flags f;
  // 3 prompts x 32 steps on both models fits ~10 minutes on 2 cores.
  f.options.steps = 32;
  cli::Args a(
      "token_match",
      "Greedy token match and KL per policy and budget (see the header).");
  a.Flag("models", absl::StrJoin(f.models, ","), "GGUF files, comma-separated");
  a.Flag("precision", f.precision, "bf16 or fp32");
  a.Flag("prompts", f.prompts, "JSON file with the multi-turn conversations");
  a.Flag("max_prompts", std::to_string(f.max_prompts),
         "use at most this many conversations");
  a.Flag("steps", std::to_string(f.options.steps),
         "teacher-forced decode steps compared");
  a.Flag("threads", std::to_string(f.threads), "worker threads");
  a.Flag("budgets", "64,128,256,512,1024", "K/V budgets B, comma-separated");
  a.Flag("policies", absl::StrJoin(f.options.policies, ","),
         "policies, comma-separated");
  a.Switch("free_running",
           "each policy decodes greedily on its own tokens (compare "
           "sequences) instead of being fed the full cache's");
  a.Flag("csv", "", "write the results as CSV here");
  a.Flag("markdown", "", "write the results as a Markdown table here");
  KVD_RETURN_IF_ERROR(a.Parse(std::vector<std::string>(argv + 1, argv + argc)));
  if (a.help_requested()) {
    std::fputs(a.Help().c_str(), stdout);
    std::exit(0);
  }
  f.models = absl::StrSplit(a.Get("models"), ',', absl::SkipEmpty());
  f.precision = a.Get("precision");
  f.prompts = a.Get("prompts");
  f.csv = a.Get("csv");
  f.markdown = a.Get("markdown");
  f.options.free_running = a.Has("free_running");
  f.options.policies =
      absl::StrSplit(a.Get("policies"), ',', absl::SkipEmpty());
  KVD_ASSIGN_OR_RETURN(f.max_prompts, a.GetInt("max_prompts"));
  KVD_ASSIGN_OR_RETURN(f.options.steps, a.GetInt("steps"));
  KVD_ASSIGN_OR_RETURN(int64_t threads, a.GetInt("threads"));
  f.threads = static_cast<int>(threads);
  KVD_ASSIGN_OR_RETURN(f.options.budgets, ParseInts(a.Get("budgets")));
  if (f.precision != "bf16" && f.precision != "fp32") {
    return absl::InvalidArgumentError("--precision must be fp32 or bf16");
  }
  return f;
}

struct Conversation {
  std::string name;
  std::vector<ops::ChatMessage> messages;
};

absl::StatusOr<std::vector<Conversation>> ReadPrompts(const std::string& path) {
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
  std::vector<Conversation> out;
  for (const nlohmann::json& c : j) {
    if (!c.contains("name") || !c.contains("messages") ||
        !c["messages"].is_array()) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": every conversation needs a name and a messages array"));
    }
    Conversation conv;
    conv.name = c["name"].get<std::string>();
    for (const nlohmann::json& m : c["messages"]) {
      conv.messages.push_back(
          {m.value("role", std::string()), m.value("content", std::string())});
    }
    out.push_back(std::move(conv));
  }
  return out;
}

// Match % and KL pooled over prompts, per (model, policy, budget).
struct Pooled {
  int64_t steps = 0, matches = 0, runs = 0, prefix_sum = 0, kl_steps = 0;
  double kl_sum = 0, max_kl = 0;
};

std::string ModelName(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

absl::Status Run(const Flags& flags) {
  if (const char* ws = std::getenv("BUILD_WORKSPACE_DIRECTORY")) {
    // Under `bazel run` the working directory is the runfiles tree; relative
    // paths mean the repository.
    if (chdir(ws) != 0) return absl::InternalError("chdir failed");
  }
  KVD_ASSIGN_OR_RETURN(std::vector<Conversation> prompts,
                       ReadPrompts(flags.prompts));
  if (static_cast<int64_t>(prompts.size()) > flags.max_prompts)
    prompts.resize(flags.max_prompts);

  std::ostringstream csv, md;
  const char* mode = flags.options.free_running ? "free" : "forced";
  csv << "model,precision,mode,prompt,prompt_tokens,policy,budget,steps,"
         "matches,match_pct,identical_prefix,kl_steps,mean_kl,max_kl,"
         "seconds\n";
  const auto start = std::chrono::steady_clock::now();
  for (const std::string& path : flags.models) {
    ops::LoadOptions load;
    load.precision = flags.precision == "bf16" ? ops::Precision::kBf16
                                               : ops::Precision::kF32;
    load.num_threads = flags.threads;
    KVD_ASSIGN_OR_RETURN(std::unique_ptr<ops::Model> model,
                         ops::Model::Load(path, load));
    KVD_ASSIGN_OR_RETURN(std::unique_ptr<ops::Tokenizer> tokenizer,
                         ops::TokenizerFromGguf(model->file()));
    std::optional<std::string_view> jinja;
    if (const ops::GgufValue* v =
            model->file().Find("tokenizer.chat_template")) {
      jinja = v->AsString();
    }
    KVD_ASSIGN_OR_RETURN(
        ops::ChatTemplate tmpl,
        ops::ChatTemplate::Detect(model->file().architecture(), jinja));
    std::map<std::pair<std::string, int64_t>, Pooled> pooled;
    std::vector<int64_t> lengths;
    for (const Conversation& conv : prompts) {
      KVD_ASSIGN_OR_RETURN(std::string text, tmpl.Render(conv.messages, true));
      const std::vector<int32_t> ids =
          tokenizer->Encode(text, /*add_special=*/true, /*parse_special=*/true);
      lengths.push_back(ids.size());
      std::fprintf(stderr, "%s / %s: %zu prompt tokens\n",
                   ModelName(path).c_str(), conv.name.c_str(), ids.size());
      experiments::TokenMatchOptions options = flags.options;
      options.on_result = [&](const experiments::TokenMatchResult& r) {
        std::fprintf(
            stderr,
            "  %-14s B=%-5lld match %5.1f%%  prefix %3lld  KL %.4g  (%.1f s)\n",
            r.policy.c_str(), static_cast<long long>(r.budget),
            100.0 * r.match_fraction(),
            static_cast<long long>(r.identical_prefix), r.mean_kl, r.seconds);
      };
      KVD_ASSIGN_OR_RETURN(experiments::TokenMatchRun run,
                           experiments::RunTokenMatch(*model, ids, options));
      for (const experiments::TokenMatchResult& r : run.results) {
        csv << absl::StrFormat(
            "%s,%s,%s,%s,%d,%s,%d,%d,%d,%.2f,%d,%d,%.6g,%.6g,%.2f\n",
            ModelName(path), flags.precision, mode, conv.name,
            run.prompt_tokens, r.policy, r.budget, r.steps, r.matches,
            100.0 * r.match_fraction(), r.identical_prefix, r.kl_steps,
            r.mean_kl, r.max_kl, r.seconds);
        Pooled& p = pooled[{r.policy, r.budget}];
        p.steps += r.steps;
        p.matches += r.matches;
        ++p.runs;
        p.prefix_sum += r.identical_prefix;
        p.kl_steps += r.kl_steps;
        p.kl_sum += r.mean_kl * r.kl_steps;
        p.max_kl = std::max(p.max_kl, r.max_kl);
      }
    }
    md << "### " << ModelName(path) << " (" << flags.precision << ", "
       << prompts.size() << " prompts of " << absl::StrJoin(lengths, ", ")
       << " tokens, " << flags.options.steps << " steps each, " << mode
       << ")\n\n"
       << (flags.options.free_running
               ? "free-running: token match % / mean identical prefix "
                 "(tokens) / mean KL over the steps before divergence\n\n"
               : "token match % / mean KL(full || policy) in nats\n\n")
       << "| policy |";
    for (int64_t b : flags.options.budgets) md << " B=" << b << " |";
    md << "\n|---|";
    for (size_t i = 0; i < flags.options.budgets.size(); ++i) md << "---|";
    md << "\n";
    for (const std::string& policy : flags.options.policies) {
      md << "| " << policy << " |";
      for (int64_t b : flags.options.budgets) {
        const Pooled& p = pooled[{policy, b}];
        if (flags.options.free_running) {
          md << absl::StrFormat(" %.1f / %.1f / %.3g |",
                                100.0 * p.matches / p.steps,
                                static_cast<double>(p.prefix_sum) / p.runs,
                                p.kl_steps > 0 ? p.kl_sum / p.kl_steps : 0.0);
        } else {
          md << absl::StrFormat(" %.1f / %.3g |", 100.0 * p.matches / p.steps,
                                p.kl_steps > 0 ? p.kl_sum / p.kl_steps : 0.0);
        }
      }
      md << "\n";
    }
    md << "\n";
  }
  const double total =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  md << absl::StrFormat("Total wall time: %.0f s.\n", total);
  std::cout << md.str();
  if (!flags.csv.empty()) std::ofstream(flags.csv) << csv.str();
  if (!flags.markdown.empty()) std::ofstream(flags.markdown) << md.str();
  return absl::OkStatus();
}

}  // namespace
}  // namespace kvd

int main(int argc, char** argv) {
  absl::StatusOr<kvd::Flags> flags = kvd::ParseFlags(argc, argv);
  absl::Status s = flags.ok() ? kvd::Run(*flags) : flags.status();
  if (!s.ok()) {
    std::cerr << "token_match: " << s << "\n";
    return 1;
  }
  return 0;
}
