// `kvd bench serve`: a load generator for an OpenAI-compatible chat server.
//
// N simulated users run at once, each in a loop until --duration: with
// probability --new-fraction (or when it has none yet, or the picked one is
// --max-turns long) a user starts a new conversation, else it continues one
// of its own earlier conversations with a follow-up message. Against kvd the
// continuation sends only the new message with the conversation's
// session_id, so the server must restore the stored session (from its hot
// set, DRAM or disk); with --stateless every request carries the whole
// conversation and no session_id, which is also how to drive servers without
// sessions (llama.cpp's). Prompts come from a fixed list chosen by a seeded
// generator per user, so two runs with the same --seed send the same
// openers and follow-ups.
//
// Per request it records time to first token (with --stream), time per
// output token after the first, end-to-end latency and tokens; 429 answers
// (the server's deliberate admission refusals) are counted apart from
// failures and retried after Retry-After. Prints a Markdown table; --json
// writes the summary and every request. Against kvd each continued turn is
// also counted by where the server found the session (hot, dram, rocksdb:
// the response's session_state), and --event-at/--event-cmd run a command
// mid-run (a restart, a drain, a kill) whose effect the first turn of each
// conversation after it shows.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"
#include "tools/kvd/args.h"
#include "tools/kvd/bench_event.h"
#include "tools/kvd/chat_client.h"
#include "tools/kvd/commands.h"

namespace kvd::cli {
namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

constexpr const char* kOpeners[] = {
    "What is the capital of France?",
    "Give me three tips for learning to cook.",
    "Explain what a neural network is in simple words.",
    "Write a short poem about the sea.",
    "How do I make a cup of tea?",
    "What are the planets of the solar system?",
    "Suggest a name for a small bakery.",
    "Why is the sky blue?",
    "Describe a good morning routine.",
    "What is the difference between weather and climate?",
    "Plan a one-day trip to Rome.",
    "How does a bicycle work?",
    "List some healthy breakfast ideas.",
    "What is photosynthesis?",
    "Tell me a fun fact about octopuses.",
    "How can I improve my sleep?",
};
constexpr const char* kFollowUps[] = {
    "Can you tell me more?",
    "Summarize that in one sentence.",
    "Why is that?",
    "Give me an example.",
    "And what about the opposite?",
    "Make it shorter.",
    "What should I do next?",
    "Can you explain it to a child?",
};

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

struct RequestRecord {
  int user = 0;
  std::string session;
  bool resumed = false;  // a continuation of an earlier conversation
  int turn = 0;          // 1 = the conversation's first message
  int http_status = 0;   // 0: no HTTP exchange (connection error)
  bool ok = false;
  bool unfinished = false;  // aborted by --drain at the end of the run
  std::string error;
  double start_s = 0;  // since the run started
  double ttft_s = -1;
  double tpot_s = -1;
  double latency_s = 0;
  int64_t prompt_tokens = -1;
  int64_t output_tokens = 0;
  std::string state;    // kvd's session_state ("" from other servers)
  std::string node;     // X-Kvd-Node, through a kvd router
  int events_seen = 0;  // --event-cmd runs before it started
  bool first_after_event = false;  // a conversation's first turn after one
  bool moved = false;  // another node answered than the conversation's last
};

struct Config {
  ServerUrl url;
  std::string api_key, model, run_id;
  int users = 32;
  double duration_s = 300, new_fraction = 0.3, think_s = 0;
  int max_turns = 8;
  int64_t max_tokens = 64;
  double temperature = 0;
  double drain_s = -1;  // < 0: wait for every request to finish
  int64_t seed = 1;
  bool stream = false, stateless = false, ignore_eos = false;
  absl::Duration timeout = absl::Seconds(600);
  double event_at_s = -1;  // < 0: no event
  std::string event_cmd, event_name;
};

// Everything the users record, under one lock (a few records per second).
class Recorder {
 public:
  void Add(RequestRecord r) {
    std::lock_guard<std::mutex> l(mu_);
    if (!r.ok && !r.unfinished && r.http_status != 429 && errors_.size() < 5 &&
        std::find(errors_.begin(), errors_.end(), r.error) == errors_.end()) {
      errors_.push_back(r.error);
      std::fprintf(stderr, "kvd bench serve: request failed (HTTP %d): %s\n",
                   r.http_status, r.error.c_str());
    }
    records_.push_back(std::move(r));
  }
  std::vector<RequestRecord> Take() {
    std::lock_guard<std::mutex> l(mu_);
    return std::move(records_);
  }

 private:
  std::mutex mu_;
  std::vector<RequestRecord> records_;
  std::vector<std::string> errors_;
};

// The users' clients, so that requests still running --drain seconds after
// the deadline can be aborted.
class ClientRegistry {
 public:
  void Add(ChatClient* c) {
    std::lock_guard<std::mutex> l(mu_);
    if (stopped_) c->Stop();
    clients_.push_back(c);
  }
  void Remove(ChatClient* c) {
    std::lock_guard<std::mutex> l(mu_);
    clients_.erase(std::find(clients_.begin(), clients_.end(), c));
  }
  // Called once every user thread has returned.
  void Finish() {
    std::lock_guard<std::mutex> l(mu_);
    finished_ = true;
    cv_.notify_all();
  }
  // Waits until Finish() or `until` (never, if `wait_forever`); then stops
  // the clients still running. (Waiting for "no clients" instead would end
  // at once if it ran before the users registered theirs.)
  void StopAt(Clock::time_point until, bool wait_forever) {
    std::unique_lock<std::mutex> l(mu_);
    if (wait_forever) {
      cv_.wait(l, [this] { return finished_; });
    } else {
      cv_.wait_until(l, until, [this] { return finished_; });
    }
    stopped_ = true;
    for (ChatClient* c : clients_) c->Stop();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<ChatClient*> clients_;
  bool stopped_ = false;
  bool finished_ = false;
};

struct Conversation {
  std::string id;
  std::vector<ChatMessageText> history;  // stateless mode only
  int turns = 0;
  int events_seen = 0;  // as of its last turn
  std::string node;     // that answered its last turn
};

void RunUser(const Config& cfg, int user, Clock::time_point t0,
             Clock::time_point deadline, Recorder& rec, ClientRegistry& clients,
             EventGate& gate) {
  ChatClient client(cfg.url, cfg.api_key, cfg.timeout);
  clients.Add(&client);
  struct Unregister {
    ClientRegistry& r;
    ChatClient* c;
    ~Unregister() { r.Remove(c); }
  } unregister{clients, &client};
  std::mt19937_64 rng(static_cast<uint64_t>(cfg.seed) * 1000003u + user);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<Conversation> convs;
  int started = 0;
  while (Clock::now() < deadline) {
    Conversation* conv = nullptr;
    const bool want_new = convs.empty() || unit(rng) < cfg.new_fraction;
    if (!want_new) {
      conv = &convs[rng() % convs.size()];
      if (conv->turns >= cfg.max_turns) conv = nullptr;
    }
    std::string message;
    if (conv == nullptr) {
      convs.push_back(Conversation{
          absl::StrCat("bench-", cfg.run_id, "-u", user, "-c", started++)});
      conv = &convs.back();
      message = kOpeners[rng() % std::size(kOpeners)];
    } else {
      message = kFollowUps[rng() % std::size(kFollowUps)];
    }
    ChatCall call;
    call.model = cfg.model;
    call.max_tokens = cfg.max_tokens;
    call.temperature = cfg.temperature;
    call.seed = cfg.seed;
    call.stream = cfg.stream;
    call.ignore_eos = cfg.ignore_eos;
    if (cfg.stateless) {
      call.messages = conv->history;
    } else {
      call.session_id = conv->id;
    }
    call.messages.push_back({"user", message});

    // A 429 is retried (the same message) after Retry-After until the
    // deadline; each refusal is recorded.
    bool drop = false;
    for (;;) {
      RequestRecord r;
      r.user = user;
      r.session = conv->id;
      r.turn = conv->turns + 1;
      r.resumed = conv->turns > 0;
      r.events_seen = gate.Enter();
      r.first_after_event =
          conv->turns > 0 && conv->events_seen < r.events_seen;
      r.start_s = Seconds(t0, Clock::now());
      absl::StatusOr<ChatCallResult> res = client.Complete(call, nullptr);
      gate.Leave();
      if (!res.ok()) {
        r.error = std::string(res.status().message());
        r.latency_s = Seconds(t0, Clock::now()) - r.start_s;
        r.unfinished = res.status().code() == absl::StatusCode::kCancelled;
        drop = true;
        if (r.unfinished) {  // the run is over: --drain stopped this client
          rec.Add(std::move(r));
          return;
        }
      } else {
        r.http_status = res->http_status;
        r.ok = res->ok();
        r.error = res->error;
        r.latency_s = res->latency_s;
        r.ttft_s = res->ttft_s;
        r.prompt_tokens = res->prompt_tokens;
        r.output_tokens = res->output_tokens();
        r.state = res->session_state;
        r.node = res->node;
        r.moved =
            !conv->node.empty() && !r.node.empty() && r.node != conv->node;
        if (r.ok && r.ttft_s >= 0 && r.output_tokens > 1) {
          r.tpot_s = (r.latency_s - r.ttft_s) / (r.output_tokens - 1);
        }
        if (r.ok) {
          ++conv->turns;
          conv->events_seen = r.events_seen;
          conv->node = r.node;
          if (cfg.stateless) {
            conv->history.push_back({"user", message});
            conv->history.push_back({"assistant", res->text});
          }
        } else if (r.http_status != 429) {
          drop = true;  // the conversation's state on the server is unknown
        }
      }
      const bool refused = r.http_status == 429;
      const int retry_after = res.ok() ? res->retry_after_s : -1;
      rec.Add(std::move(r));
      if (!refused) break;
      std::this_thread::sleep_for(
          std::chrono::seconds(std::max(1, retry_after)));
      if (Clock::now() >= deadline) break;
    }
    if (drop || conv->turns == 0)
      convs.erase(convs.begin() + (conv - convs.data()));
    if (cfg.think_s > 0) {
      std::exponential_distribution<double> think(1.0 / cfg.think_s);
      std::this_thread::sleep_for(std::chrono::duration<double>(
          std::min(think(rng), 10 * cfg.think_s)));
    }
  }
}

// The server's resident memory, sampled once a second (--server-pid).
class RssSampler {
 public:
  explicit RssSampler(int pid) : pid_(pid) {
    if (pid_ > 0) thread_ = std::thread([this] { Loop(); });
  }
  ~RssSampler() { Stop(); }
  void Stop() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  bool enabled() const { return pid_ > 0; }
  // MiB: first sample, largest sample, last sample, the kernel's VmHWM.
  double first = -1, max = -1, last = -1, hwm = -1;
  int samples = 0;
  std::vector<std::pair<double, double>> series;  // (seconds, RSS MiB)

 private:
  void Sample() {
    std::ifstream f(absl::StrCat("/proc/", pid_, "/status"));
    std::string line;
    while (std::getline(f, line)) {
      long kb = 0;
      if (std::sscanf(line.c_str(), "VmRSS: %ld kB", &kb) == 1) {
        last = kb / 1024.0;
        series.emplace_back(Seconds(start_, Clock::now()), last);
        if (first < 0) first = last;
        max = std::max(max, last);
        ++samples;
      }
      if (std::sscanf(line.c_str(), "VmHWM: %ld kB", &kb) == 1) {
        hwm = kb / 1024.0;
      }
    }
  }
  void Loop() {
    std::unique_lock<std::mutex> l(mu_);
    while (!stop_) {
      Sample();
      cv_.wait_for(l, std::chrono::seconds(1));
    }
    Sample();
  }
  int pid_;
  Clock::time_point start_ = Clock::now();
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

std::string LoadAvg() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return absl::StrCat(a, " ", b, " ", c);
}

// Nearest-rank percentile; -1 for no samples.
double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * v.size()));
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

struct Stats {
  int64_t requests = 0, ok = 0, failures = 0, refused = 0, unfinished = 0,
          tokens = 0;
  std::vector<double> ttft, tpot, latency;
};

Stats Summarize(const std::vector<RequestRecord>& recs, int which) {
  Stats s;  // which: 0 all, 1 new conversations, 2 resumed
  for (const RequestRecord& r : recs) {
    if ((which == 1 && r.resumed) || (which == 2 && !r.resumed)) continue;
    ++s.requests;
    if (r.http_status == 429) {
      ++s.refused;
      continue;
    }
    if (r.unfinished) {
      ++s.unfinished;
      continue;
    }
    if (!r.ok) {
      ++s.failures;
      continue;
    }
    ++s.ok;
    s.tokens += r.output_tokens;
    s.latency.push_back(r.latency_s);
    if (r.ttft_s >= 0) s.ttft.push_back(r.ttft_s);
    if (r.tpot_s >= 0) s.tpot.push_back(r.tpot_s);
  }
  return s;
}

// The row of a continued turn in the "where the session was found" table:
// the first turn of a conversation after the event gets its own row.
std::string WhereFound(const RequestRecord& r, const Config& cfg) {
  const std::string state = r.state.empty() ? "continued" : r.state;
  if (!r.first_after_event) return state;
  return absl::StrCat("first after ", cfg.event_name,
                      r.moved ? ", on another node: " : ": ", state);
}

std::string Ms(double s) {
  return s < 0 ? std::string("-") : absl::StrFormat("%.0f", s * 1e3);
}

std::string Pcts(const std::vector<double>& v) {
  return absl::StrCat(Ms(Percentile(v, 50)), " / ", Ms(Percentile(v, 90)),
                      " / ", Ms(Percentile(v, 99)));
}

json PctJson(const std::vector<double>& v) {
  return {{"p50", Percentile(v, 50)},
          {"p90", Percentile(v, 90)},
          {"p99", Percentile(v, 99)},
          {"n", v.size()}};
}

absl::StatusOr<Config> ConfigFromFlags(const Args& args) {
  Config c;
  KVD_ASSIGN_OR_RETURN(c.url, ParseServerUrl(args.Get("url")));
  c.api_key = args.Get("api-key");
  if (c.api_key.empty()) {
    if (const char* k = std::getenv("KVD_API_KEY")) c.api_key = k;
  }
  c.model = args.Get("model");
  KVD_ASSIGN_OR_RETURN(int64_t users, args.GetInt("sessions"));
  KVD_ASSIGN_OR_RETURN(c.duration_s, args.GetDouble("duration"));
  KVD_ASSIGN_OR_RETURN(c.new_fraction, args.GetDouble("new-fraction"));
  KVD_ASSIGN_OR_RETURN(c.think_s, args.GetDouble("think-time"));
  KVD_ASSIGN_OR_RETURN(int64_t turns, args.GetInt("max-turns"));
  KVD_ASSIGN_OR_RETURN(c.max_tokens, args.GetInt("max-tokens"));
  KVD_ASSIGN_OR_RETURN(c.temperature, args.GetDouble("temperature"));
  KVD_ASSIGN_OR_RETURN(c.seed, args.GetInt("seed"));
  KVD_ASSIGN_OR_RETURN(double timeout_s, args.GetDouble("timeout"));
  if (args.Has("drain")) {
    KVD_ASSIGN_OR_RETURN(c.drain_s, args.GetDouble("drain"));
  }
  if (args.Has("event-at") != args.Has("event-cmd")) {
    return absl::InvalidArgumentError(
        "--event-at and --event-cmd go together: at that second of the run, "
        "run that command while the users wait");
  }
  if (args.Has("event-at")) {
    KVD_ASSIGN_OR_RETURN(c.event_at_s, args.GetDouble("event-at"));
    if (!(c.event_at_s >= 0)) {
      return absl::InvalidArgumentError("--event-at must be >= 0 seconds");
    }
    c.event_cmd = args.Get("event-cmd");
    c.event_name = args.Get("event-name");
  }
  if (users < 1 || users > 4096) {
    return absl::InvalidArgumentError("--sessions must be in [1, 4096]");
  }
  if (!(c.duration_s > 0) || !(c.new_fraction >= 0 && c.new_fraction <= 1) ||
      !(c.think_s >= 0) || turns < 1 || c.max_tokens < 1 || !(timeout_s > 0)) {
    return absl::InvalidArgumentError(
        "--duration and --timeout must be > 0, --new-fraction in [0, 1], "
        "--think-time >= 0, --max-turns and --max-tokens >= 1");
  }
  c.users = static_cast<int>(users);
  c.max_turns = static_cast<int>(turns);
  c.timeout = absl::Seconds(timeout_s);
  c.stream = args.Has("stream");
  c.stateless = args.Has("stateless");
  c.ignore_eos = args.Has("ignore-eos");
  c.run_id = args.Get("run-id");
  if (c.run_id.empty()) {
    c.run_id = absl::StrFormat(
        "%x", static_cast<uint64_t>(
                  std::chrono::system_clock::now().time_since_epoch().count()) &
                  0xffffffffffULL);
  }
  return c;
}

absl::Status Run(const Args& args) {
  KVD_ASSIGN_OR_RETURN(Config cfg, ConfigFromFlags(args));
  int64_t pid = 0;
  if (args.Has("server-pid")) {
    KVD_ASSIGN_OR_RETURN(pid, args.GetInt("server-pid"));
  }
  if (cfg.model.empty()) {
    ChatClient probe(cfg.url, cfg.api_key, absl::Seconds(30));
    KVD_ASSIGN_OR_RETURN(cfg.model, probe.FirstModelId());
  }
  const std::string load_before = LoadAvg();
  std::fprintf(stderr,
               "kvd bench serve: %d users for %.0f s against %s (model %s, "
               "%s, %s, max_tokens %lld, new fraction %.2f, run %s)\n",
               cfg.users, cfg.duration_s, cfg.url.scheme_host_port.c_str(),
               cfg.model.c_str(),
               cfg.stateless ? "stateless: whole conversation each request"
                             : "sessions: new message + session_id",
               cfg.stream ? "streaming" : "not streaming",
               static_cast<long long>(cfg.max_tokens), cfg.new_fraction,
               cfg.run_id.c_str());
  RssSampler rss(static_cast<int>(pid));
  Recorder rec;
  const Clock::time_point t0 = Clock::now();
  const Clock::time_point deadline =
      t0 + std::chrono::duration_cast<Clock::duration>(
               std::chrono::duration<double>(cfg.duration_s));
  ClientRegistry clients;
  EventGate gate;
  EventGate::Outcome event;
  std::thread event_thread;
  if (cfg.event_at_s >= 0) {
    event_thread = std::thread([&cfg, &gate, &event, t0] {
      event =
          gate.RunAt(t0 + std::chrono::duration_cast<Clock::duration>(
                              std::chrono::duration<double>(cfg.event_at_s)),
                     cfg.event_cmd);
    });
  }
  std::vector<std::thread> users;
  for (int u = 0; u < cfg.users; ++u) {
    users.emplace_back([&cfg, u, t0, deadline, &rec, &clients, &gate] {
      RunUser(cfg, u, t0, deadline, rec, clients, gate);
    });
  }
  const bool wait_forever = cfg.drain_s < 0;
  const Clock::time_point hard_stop =
      wait_forever ? deadline
                   : deadline + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(cfg.drain_s));
  std::thread watchdog([&clients, hard_stop, wait_forever] {
    clients.StopAt(hard_stop, wait_forever);
  });
  for (std::thread& t : users) t.join();
  clients.Finish();
  watchdog.join();
  gate.Cancel();
  if (event_thread.joinable()) event_thread.join();
  const double wall_s = Seconds(t0, Clock::now());
  rss.Stop();
  const std::string load_after = LoadAvg();
  const std::vector<RequestRecord> recs = rec.Take();

  std::printf(
      "\n| requests | kind | ok | failed | 429 | cut at end | output tok | "
      "tok/s | TTFT ms p50/p90/p99 | TPOT ms p50/p90/p99 | latency ms "
      "p50/p90/p99 |\n"
      "|---:|---|---:|---:|---:|---:|---:|---:|---|---|---|\n");
  const char* kinds[] = {"all", "new conversation", "continued"};
  json summary;
  for (int k = 0; k < 3; ++k) {
    const Stats s = Summarize(recs, k);
    std::printf(
        "| %lld | %s | %lld | %lld | %lld | %lld | %lld | %.1f | %s | %s | %s "
        "|\n",
        static_cast<long long>(s.requests), kinds[k],
        static_cast<long long>(s.ok), static_cast<long long>(s.failures),
        static_cast<long long>(s.refused), static_cast<long long>(s.unfinished),
        static_cast<long long>(s.tokens), s.tokens / wall_s,
        Pcts(s.ttft).c_str(), Pcts(s.tpot).c_str(), Pcts(s.latency).c_str());
    summary[k == 0   ? "all"
            : k == 1 ? "new"
                     : "continued"] = {
        {"requests", s.requests},
        {"ok", s.ok},
        {"failures", s.failures},
        {"rejected_429", s.refused},
        {"unfinished", s.unfinished},
        {"output_tokens", s.tokens},
        {"output_tokens_per_s", s.tokens / wall_s},
        {"ttft_s", PctJson(s.ttft)},
        {"tpot_s", PctJson(s.tpot)},
        {"latency_s", PctJson(s.latency)}};
  }
  // Continued turns by where the session was found: the returning user's
  // view of the server's tiers.
  std::map<std::string, std::vector<double>> found;
  for (const RequestRecord& r : recs) {
    if (r.ok && r.resumed && r.ttft_s >= 0) {
      found[WhereFound(r, cfg)].push_back(r.ttft_s);
    }
  }
  std::printf(
      "\n| continued turns: session found | turns | TTFT ms p50 / p90 / p99 "
      "|\n|---|---:|---|\n");
  json by_state = json::object();
  for (const auto& [where, v] : found) {
    std::printf("| %s | %zu | %s |\n", where.c_str(), v.size(),
                Pcts(v).c_str());
    by_state[where] = PctJson(v);
  }
  summary["continued_by_state"] = by_state;
  if (cfg.event_at_s >= 0) {
    if (event.ran) {
      std::printf(
          "\nevent '%s' at %.0f s: users held %.1f s (running requests "
          "finished, then the command took %.1f s, exit %d)\n",
          cfg.event_name.c_str(), cfg.event_at_s, event.held_s, event.command_s,
          event.exit_code);
    } else {
      std::printf("\nevent '%s' did not run: the run ended first\n",
                  cfg.event_name.c_str());
    }
    summary["event"] = {
        {"name", cfg.event_name}, {"at_s", cfg.event_at_s},
        {"ran", event.ran},       {"exit_code", event.exit_code},
        {"held_s", event.held_s}, {"command_s", event.command_s}};
  }
  std::printf(
      "\nwall %.1f s (requests start until %.0f s, the last ones then finish "
      "or are cut); "
      "load average before %s, after %s\n",
      wall_s, cfg.duration_s, load_before.c_str(), load_after.c_str());
  if (rss.enabled()) {
    std::printf(
        "server pid %lld RSS MiB: start %.0f, max %.0f, end %.0f (VmHWM %.0f, "
        "%d samples)\n",
        static_cast<long long>(pid), rss.first, rss.max, rss.last, rss.hwm,
        rss.samples);
  }
  const Stats all = Summarize(recs, 0);
  std::printf("RESULT failures=%lld rejected_429=%lld ok=%lld\n",
              static_cast<long long>(all.failures),
              static_cast<long long>(all.refused),
              static_cast<long long>(all.ok));
  if (args.Has("json")) {
    json j;
    j["config"] = {{"url", cfg.url.scheme_host_port + cfg.url.prefix},
                   {"model", cfg.model},
                   {"users", cfg.users},
                   {"duration_s", cfg.duration_s},
                   {"new_fraction", cfg.new_fraction},
                   {"max_tokens", cfg.max_tokens},
                   {"max_turns", cfg.max_turns},
                   {"think_time_s", cfg.think_s},
                   {"drain_s", cfg.drain_s},
                   {"temperature", cfg.temperature},
                   {"seed", cfg.seed},
                   {"stream", cfg.stream},
                   {"stateless", cfg.stateless},
                   {"run_id", cfg.run_id}};
    j["summary"] = summary;
    j["wall_s"] = wall_s;
    j["load_before"] = load_before;
    j["load_after"] = load_after;
    if (rss.enabled()) {
      j["server_rss_mib"] = {
          {"start", rss.first},     {"max", rss.max},
          {"end", rss.last},        {"vm_hwm", rss.hwm},
          {"samples", rss.samples}, {"series_s_mib", rss.series}};
    }
    json rs = json::array();
    for (const RequestRecord& r : recs) {
      rs.push_back({{"user", r.user},
                    {"session", r.session},
                    {"turn", r.turn},
                    {"resumed", r.resumed},
                    {"http_status", r.http_status},
                    {"ok", r.ok},
                    {"unfinished", r.unfinished},
                    {"error", r.error},
                    {"start_s", r.start_s},
                    {"ttft_s", r.ttft_s},
                    {"tpot_s", r.tpot_s},
                    {"latency_s", r.latency_s},
                    {"prompt_tokens", r.prompt_tokens},
                    {"output_tokens", r.output_tokens},
                    {"state", r.state},
                    {"node", r.node},
                    {"events_seen", r.events_seen},
                    {"first_after_event", r.first_after_event},
                    {"moved", r.moved}});
    }
    j["requests"] = std::move(rs);
    std::ofstream f(args.Get("json"));
    f << j.dump(1, ' ', false, json::error_handler_t::replace) << "\n";
    if (!f) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot write --json file ", args.Get("json")));
    }
  }
  return absl::OkStatus();
}

}  // namespace

int BenchServeCommand(const std::vector<std::string>& argv) {
  Args args("kvd bench serve",
            "Load-tests an OpenAI-compatible chat server with concurrent "
            "simulated users, each starting new conversations or continuing "
            "its earlier ones, and prints throughput and latency "
            "percentiles.\nExample: kvd bench serve --url "
            "http://127.0.0.1:8080 --sessions 32 --duration 300 --stream");
  args.Flag("url", "http://127.0.0.1:8080", "the server (http only)");
  args.Flag("api-key", "", "bearer key (default: $KVD_API_KEY)");
  args.Flag("model", "",
            "model name in requests; empty = the first of GET /v1/models");
  args.Flag("sessions", "32", "concurrent simulated users");
  args.Flag("duration", "300",
            "seconds during which users start requests (the last ones then "
            "finish)");
  args.Flag("new-fraction", "0.3",
            "probability that a user's next request starts a new "
            "conversation instead of continuing one of its earlier ones");
  args.Flag("max-turns", "8",
            "user messages per conversation; a longer one is not continued");
  args.Flag("max-tokens", "64", "max_tokens of every request");
  args.Flag("temperature", "0", "temperature of every request");
  args.Flag("seed", "1", "seed of the prompt choice and of every request");
  args.Flag("think-time", "0",
            "mean pause in seconds between a user's requests (exponential)");
  args.Switch("stream",
              "stream replies (SSE); needed for time to first token and time "
              "per output token");
  args.Switch("stateless",
              "send the whole conversation each time, without session_id "
              "(servers without sessions, e.g. llama.cpp's)");
  args.Switch("ignore-eos",
              "ask the server to generate max_tokens every time (kvd, vLLM)");
  args.Flag("timeout", "600", "seconds to wait for a reply (queueing too)");
  args.Flag("drain", "",
            "seconds after --duration to let running requests finish; those "
            "still running are then aborted and counted as 'cut at end' "
            "(default: wait for all)");
  args.Flag("server-pid", "",
            "sample this local process's RSS (VmRSS, VmHWM) once a second");
  args.Flag("event-at", "",
            "run --event-cmd at this second of the run: new requests wait, "
            "running ones finish, the command runs, the users go on (the "
            "wait is reported, not counted in latencies)");
  args.Flag("event-cmd", "",
            "shell command of the event, e.g. one that restarts the server "
            "and waits until it is ready");
  args.Flag("event-name", "event",
            "the event's name in the tables (restart, migration, failover)");
  args.Flag("json", "", "also write the summary and every request here");
  args.Flag("run-id", "",
            "part of every session id (default: from the clock, so runs do "
            "not continue each other's sessions)");
  return args.Main(argv, Run);
}

}  // namespace kvd::cli
