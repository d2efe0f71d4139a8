// `kvd chat`: a durable conversation with a local model. Each message is one
// turn of a named session; the session's model state is committed to the
// data directory after every turn, so `kvd chat --session NAME` continues it
// later, in another process, after a crash, bit-identically.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"
#include "tools/kvd/commands.h"
#include "tools/kvd/sampling_flags.h"
#include "tools/kvd/session_runtime.h"

namespace kvd::cli {
namespace {

void DeclareFlags(Args& a) {
  a.Positional("MESSAGE...",
               "messages to send, one turn each; without any, read one "
               "message per line from stdin until EOF or /exit");
  a.Flag("session", "default",
         "session name: created on first use, continued afterwards");
  a.Flag("system", "", "system message (first turn of a new session only)");
  a.Switch("raw",
           "send messages as raw text without the chat template (models "
           "without one)");
  a.Switch("jsonl",
           "print one JSON object per turn (text, token ids, path) instead "
           "of plain text");
  a.Flag("dump-logits", "",
         "append every step's logits (float32, vocab per step) to this file; "
         "for bit-identity checks");
  DeclareModelFlags(a);
  DeclareStoreFlags(a);
  DeclareSessionFlags(a);
  DeclareSamplingFlags(a);
}

absl::StatusOr<std::vector<int32_t>> TurnTokens(
    const node::NodeRuntime& rt, const Args& args, const std::string& message,
    absl::Span<const int32_t> session_tokens) {
  const bool first = session_tokens.empty();
  if (args.Has("raw") || !rt.chat_template().has_value()) {
    return rt.tokenizer().Encode(message, /*add_special=*/first,
                                 /*parse_special=*/false);
  }
  std::string text;
  if (first) {
    std::vector<ops::ChatMessage> messages;
    if (args.Has("system")) messages.push_back({"system", args.Get("system")});
    messages.push_back({"user", message});
    KVD_ASSIGN_OR_RETURN(text, rt.chat_template()->Render(messages, true));
  } else {
    KVD_ASSIGN_OR_RETURN(
        text,
        rt.chat_template()->RenderFollowUp(
            {"user", message}, rt.tokenizer().IsEog(session_tokens.back())));
  }
  return rt.tokenizer().Encode(text, /*add_special=*/first,
                               /*parse_special=*/true);
}

absl::Status RunTurn(node::NodeRuntime& rt, const Args& args,
                     const engine::GenerateRequest& sampling,
                     const std::string& message, std::ofstream* logits) {
  engine::TurnRequest turn;
  turn.tenant = args.Get("tenant");
  turn.session = args.Get("session");
  turn.generate = sampling;
  turn.make_tokens = [&](absl::Span<const int32_t> have) {
    return TurnTokens(rt, args, message, have);
  };
  if (logits != nullptr) {
    turn.generate.on_logits = [logits](const float* l, int64_t n) {
      logits->write(reinterpret_cast<const char*>(l), n * sizeof(float));
    };
  }
  const bool jsonl = args.Has("jsonl");
  KVD_ASSIGN_OR_RETURN(
      engine::TurnResult r,
      rt.engine().RunTurn(turn, rt.tokenizer(), [jsonl](std::string_view s) {
        if (!jsonl) std::cout << s << std::flush;
      }));
  if (logits != nullptr) logits->flush();
  const engine::GenerateResult& g = r.generation;
  if (jsonl) {
    nlohmann::json j;
    j["session"] = turn.session;
    j["turn"] = r.turn;
    j["path"] = engine::StatePathName(r.path);
    if (!r.path_detail.empty()) j["path_detail"] = r.path_detail;
    j["restore_seconds"] = r.restore_seconds;
    j["text"] = g.text;
    j["tokens"] = g.tokens;
    j["finish_reason"] = engine::FinishReasonName(g.finish_reason);
    j["session_tokens"] = r.session_tokens;
    std::cout << j.dump(-1, ' ', false,
                        nlohmann::json::error_handler_t::replace)
              << std::endl;
  } else {
    std::cout << std::endl;
    std::fprintf(
        stderr,
        "[%s turn %llu | state: %s%s%s (%.3f s) | prefill %lld tok | decode "
        "%zu tok %.1f tok/s | %lld tokens committed]\n",
        turn.session.c_str(), static_cast<unsigned long long>(r.turn),
        engine::StatePathName(r.path), r.path_detail.empty() ? "" : ": ",
        r.path_detail.c_str(), r.restore_seconds,
        static_cast<long long>(g.prompt_tokens), g.tokens.size(),
        g.decode_seconds > 0 && g.tokens.size() > 1
            ? (g.tokens.size() - 1) / g.decode_seconds
            : 0.0,
        static_cast<long long>(r.session_tokens));
  }
  return absl::OkStatus();
}

absl::Status Run(const Args& args) {
  KVD_ASSIGN_OR_RETURN(engine::GenerateRequest sampling,
                       SamplingFromFlags(args));
  KVD_ASSIGN_OR_RETURN(
      std::unique_ptr<node::NodeRuntime> rt,
      OpenSessionRuntime(args, /*show_progress=*/!args.Has("jsonl")));
  if (!args.Has("raw") && rt->chat_template().has_value()) {
    for (const std::string& s : rt->chat_template()->stop_strings())
      sampling.stop.push_back(s);
  }
  const std::string tenant = args.Get("tenant"), session = args.Get("session");
  absl::Status created = rt->engine().CreateSession(tenant, session, {});
  if (!created.ok() && created.code() != absl::StatusCode::kAlreadyExists)
    return created;
  std::unique_ptr<std::ofstream> logits;
  if (args.Has("dump-logits")) {
    logits = std::make_unique<std::ofstream>(args.Get("dump-logits"),
                                             std::ios::binary | std::ios::app);
    if (!*logits) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot open --dump-logits file ", args.Get("dump-logits")));
    }
  }
  if (!args.positional().empty()) {
    for (const std::string& m : args.positional())
      KVD_RETURN_IF_ERROR(RunTurn(*rt, args, sampling, m, logits.get()));
    return absl::OkStatus();
  }
  const bool tty = isatty(STDIN_FILENO);
  std::string line;
  while (true) {
    if (tty) std::cout << "> " << std::flush;
    if (!std::getline(std::cin, line) || line == "/exit") break;
    if (line.empty()) continue;
    if (absl::Status s = RunTurn(*rt, args, sampling, line, logits.get());
        !s.ok()) {
      // The turn committed nothing; the session is as it was before it.
      std::fprintf(stderr, "kvd chat: %s\n", s.ToString().c_str());
      if (!tty) return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace

int ChatCommand(const std::vector<std::string>& argv) {
  Args args("kvd chat",
            "Chats with a local model in a durable session: every turn is "
            "committed to the data directory, so a later 'kvd chat --session "
            "NAME' continues the conversation where it stopped (after a "
            "restart or crash too).\nExample: kvd chat --session trip "
            "\"Plan a day in Paris\"");
  DeclareFlags(args);
  if (absl::Status s = args.Parse(argv); !s.ok()) {
    std::fprintf(stderr, "kvd chat: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  if (args.help_requested()) {
    std::fputs(args.Help().c_str(), stdout);
    return 0;
  }
  if (absl::Status s = Run(args); !s.ok()) {
    std::fprintf(stderr, "kvd chat: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace kvd::cli
