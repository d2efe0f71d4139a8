// `kvd chat`: a durable conversation with a local model. Each message is one
// turn of a named session; the session's model state is committed to the
// data directory after every turn, so `kvd chat --session NAME` continues it
// later, in another process, after a crash, bit-identically.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"
#include "services/engine/chat_turn.h"
#include "tools/kvd/chat_client.h"
#include "tools/kvd/commands.h"
#include "tools/kvd/sampling_flags.h"
#include "tools/kvd/session_runtime.h"

namespace kvd::cli {
namespace {

// Runs `turn` for each MESSAGE argument, or for each line of stdin (until
// EOF or /exit). Interactively an error is reported and the chat goes on;
// otherwise the first error ends it.
absl::Status ForEachMessage(
    const Args& args,
    const std::function<absl::Status(const std::string&)>& turn) {
  if (!args.positional().empty()) {
    for (const std::string& m : args.positional()) KVD_RETURN_IF_ERROR(turn(m));
    return absl::OkStatus();
  }
  const bool tty = isatty(STDIN_FILENO);
  std::string line;
  while (true) {
    if (tty) std::cout << "> " << std::flush;
    if (!std::getline(std::cin, line) || line == "/exit") break;
    if (line.empty()) continue;
    if (absl::Status s = turn(line); !s.ok()) {
      std::fprintf(stderr, "kvd chat: %s\n", std::string(s.message()).c_str());
      if (!tty) return s;
    }
  }
  return absl::OkStatus();
}

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
  a.Flag("server", "",
         "chat with a running 'kvd serve' at this URL (e.g. "
         "http://127.0.0.1:8080) over HTTP streaming instead of loading the "
         "model here; each turn sends only the new message with the session "
         "id. Sent: --max-tokens, --temperature, --top-p, --seed, --stop, "
         "--ignore-eos (the model, store and session flags are the "
         "server's)");
  a.Flag("api-key", "",
         "with --server: bearer key (default: $KVD_API_KEY); the key's "
         "tenant owns the session");
  a.Flag("dump-logits", "",
         "append every step's logits (float32, vocab per step) to this file; "
         "for bit-identity checks");
  a.Switch("suspend-between-turns",
           "after each turn, drop the session's K/V from memory (its "
           "checkpoint stays in the DRAM tier), so the next turn resumes it: "
           "measures resume latency without a restart "
           "(tools/bench/resume_latency.sh)");
  DeclareModelFlags(a);
  DeclareStoreFlags(a);
  DeclareSessionFlags(a);
  DeclareSamplingFlags(a);
}

absl::StatusOr<std::vector<int32_t>> TurnTokens(
    const node::NodeRuntime& rt, const Args& args, const std::string& message,
    absl::Span<const int32_t> session_tokens) {
  if (args.Has("raw") || !rt.chat_template().has_value()) {
    return rt.tokenizer().EncodePrompt(message, session_tokens.empty());
  }
  std::vector<ops::ChatMessage> messages;
  if (args.Has("system")) messages.push_back({"system", args.Get("system")});
  messages.push_back({"user", message});
  return engine::ChatTurnTokens(*rt.chat_template(), rt.tokenizer(), messages,
                                session_tokens);
}

absl::Status RunTurn(node::NodeRuntime& rt, const Args& args,
                     const engine::GenerateRequest& sampling,
                     const std::string& message, std::ofstream* logits) {
  engine::TurnRequest turn;
  turn.tenant = args.Get("tenant");
  turn.session = args.Get("session");
  turn.create_if_missing = true;  // stored only once its first turn commits
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
  // Back to its checkpoint (kept in the DRAM tier), so the next turn
  // measures a resume without a restart.
  if (args.Has("suspend-between-turns"))
    rt.engine().Suspend(turn.tenant, turn.session);
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
        "%zu tok %.1f tok/s | %lld tokens %s]\n",
        turn.session.c_str(), static_cast<unsigned long long>(r.turn),
        engine::StatePathName(r.path), r.path_detail.empty() ? "" : ": ",
        r.path_detail.c_str(), r.restore_seconds,
        static_cast<long long>(g.prompt_tokens), g.tokens.size(),
        g.decode_seconds > 0 && g.tokens.size() > 1
            ? (g.tokens.size() - 1) / g.decode_seconds
            : 0.0,
        static_cast<long long>(r.session_tokens),
        // --durability memory keeps turns in DRAM until exit: a kill -9
        // loses them, so "committed" would overstate it.
        args.Get("durability") == "memory" ? "held in memory (written at exit)"
                                           : "committed");
  }
  return absl::OkStatus();
}

// One turn against a running server; the reply is printed as it streams.
absl::Status RunServerTurn(ChatClient& client, const Args& args,
                           const ChatCall& base, const std::string& message) {
  ChatCall call = base;
  if (args.Has("system"))
    call.messages.push_back({"system", args.Get("system")});
  // On a continued session the server uses only the last (user) message, so
  // the system message matters on the first turn only.
  call.messages.push_back({"user", message});
  const bool jsonl = args.Has("jsonl");
  KVD_ASSIGN_OR_RETURN(ChatCallResult r,
                       client.Complete(call, [jsonl](absl::string_view s) {
                         if (!jsonl) std::cout << s << std::flush;
                       }));
  if (r.http_status == 429) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "server busy, retry after ", r.retry_after_s >= 0 ? r.retry_after_s : 1,
        " s (", r.error, ")"));
  }
  if (!r.ok()) {
    if (!jsonl && !r.text.empty()) std::cout << std::endl;
    if (r.http_status == 200) {
      return absl::UnavailableError(
          absl::StrCat("server error during the reply: ", r.error));
    }
    const std::string what =
        absl::StrCat("server answered HTTP ", r.http_status, ": ", r.error);
    // A 4xx is the request's fault (fix it, do not retry); 5xx the server's.
    switch (r.http_status) {
      case 400:
      case 413:
        return absl::InvalidArgumentError(what);
      case 401:
        return absl::UnauthenticatedError(what);
      case 403:
        return absl::PermissionDeniedError(what);
      case 404:
        return absl::NotFoundError(what);
      case 409:
        return absl::FailedPreconditionError(what);
      default:
        return absl::UnavailableError(what);
    }
  }
  if (jsonl) {
    nlohmann::json j;
    j["session"] = call.session_id;
    j["text"] = r.text;
    j["finish_reason"] = r.finish_reason;
    j["prompt_tokens"] = r.prompt_tokens;
    j["cached_tokens"] = r.cached_tokens;
    j["completion_tokens"] = r.completion_tokens;
    j["ttft_seconds"] = r.ttft_s;
    j["seconds"] = r.latency_s;
    std::cout << j.dump(-1, ' ', false,
                        nlohmann::json::error_handler_t::replace)
              << std::endl;
  } else {
    std::cout << std::endl;
    const int64_t n = r.output_tokens();
    const double decode_s = r.latency_s - std::max(0.0, r.ttft_s);
    std::fprintf(stderr,
                 "[%s | server | prompt %lld tok (%lld cached) | first token "
                 "%.3f s | %lld tok %.1f tok/s | %s]\n",
                 call.session_id.c_str(),
                 static_cast<long long>(r.prompt_tokens),
                 static_cast<long long>(std::max<int64_t>(0, r.cached_tokens)),
                 r.ttft_s, static_cast<long long>(n),
                 n > 1 && decode_s > 0 ? (n - 1) / decode_s : 0.0,
                 r.finish_reason.c_str());
  }
  return absl::OkStatus();
}

// `kvd chat --server URL`: the same conversation loop, over HTTP.
absl::Status RunServer(const Args& args) {
  KVD_ASSIGN_OR_RETURN(ServerUrl url, ParseServerUrl(args.Get("server")));
  KVD_ASSIGN_OR_RETURN(engine::GenerateRequest sampling,
                       SamplingFromFlags(args));
  if (sampling.max_tokens < 1) {
    return absl::InvalidArgumentError(
        "--max-tokens must be >= 1 with --server");
  }
  if (args.Has("dump-logits") || args.Has("raw")) {
    return absl::InvalidArgumentError(
        "--dump-logits and --raw work in-process only, not with --server");
  }
  std::string key = args.Get("api-key");
  if (key.empty()) {
    if (const char* k = std::getenv("KVD_API_KEY")) key = k;
  }
  ChatClient client(url, key);
  ChatCall base;
  // The API requires a model name; ask the server which one it serves.
  KVD_ASSIGN_OR_RETURN(base.model, client.FirstModelId());
  base.session_id = args.Get("session");
  base.max_tokens = sampling.max_tokens;
  base.temperature = sampling.sampling.temperature;
  base.top_p = sampling.sampling.top_p;
  base.seed = static_cast<int64_t>(sampling.sampling.seed);
  base.stop = sampling.stop;
  base.ignore_eos = sampling.ignore_eos;
  base.stream = true;
  // A refused turn (429) never reached the engine, and the engine commits
  // only finished turns: the session is as it was, so the user may simply
  // send the message again.
  return ForEachMessage(args, [&](const std::string& m) {
    return RunServerTurn(client, args, base, m);
  });
}

absl::Status Run(const Args& args) {
  if (args.Has("server")) return RunServer(args);
  KVD_ASSIGN_OR_RETURN(engine::GenerateRequest sampling,
                       SamplingFromFlags(args));
  KVD_ASSIGN_OR_RETURN(
      std::unique_ptr<node::NodeRuntime> rt,
      OpenSessionRuntime(args, /*show_progress=*/!args.Has("jsonl")));
  if (!args.Has("raw") && rt->chat_template().has_value()) {
    for (const std::string& s : rt->chat_template()->stop_strings())
      sampling.stop.push_back(s);
  }
  std::unique_ptr<std::ofstream> logits;
  if (args.Has("dump-logits")) {
    logits = std::make_unique<std::ofstream>(args.Get("dump-logits"),
                                             std::ios::binary | std::ios::app);
    if (!*logits) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot open --dump-logits file ", args.Get("dump-logits")));
    }
  }
  // A failed turn committed nothing; the session is as it was before it.
  return ForEachMessage(args, [&](const std::string& m) {
    return RunTurn(*rt, args, sampling, m, logits.get());
  });
}

}  // namespace

int ChatCommand(const std::vector<std::string>& argv) {
  Args args("kvd chat",
            "Chats with a local model in a durable session: every turn is "
            "committed to the data directory, so a later 'kvd chat --session "
            "NAME' continues the conversation where it stopped (after a "
            "restart or crash too).\nExample: kvd chat --session trip "
            "\"Plan a day in Paris\"\n         kvd chat --server "
            "http://127.0.0.1:8080 --session trip \"And tomorrow?\"");
  DeclareFlags(args);
  return args.Main(argv, Run);
}

}  // namespace kvd::cli
