// `kvd bench`: prefill and decode throughput and memory of the CPU engine, as a
// table.
//
// Shapes follow llama.cpp's llama-bench so the numbers sit side by side in
// docs/BENCHMARKS.md: "pp N" prefills N tokens in one step; "tg N" decodes N
// tokens one step at a time after a short prompt, for B sequences decoded
// together (batch B). Each figure is the median of
// --repetitions runs.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/types/span.h"
#include "base/status_macros.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/machine_ceilings.h"
#include "ops/backend/cuda_probe.h"
#include "ops/model/model.h"
#include "tools/kvd/args.h"
#include "tools/kvd/commands.h"
#include "tools/kvd/model_source.h"

namespace kvd::cli {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Resident and peak-resident memory of this process, MiB (from
// /proc/self/status).
std::pair<double, double> MemoryMiB() {
  std::ifstream f("/proc/self/status");
  std::string line;
  double rss = 0, hwm = 0;
  while (std::getline(f, line)) {
    long kb = 0;
    if (std::sscanf(line.c_str(), "VmRSS: %ld kB", &kb) == 1) rss = kb / 1024.0;
    if (std::sscanf(line.c_str(), "VmHWM: %ld kB", &kb) == 1) hwm = kb / 1024.0;
  }
  return {rss, hwm};
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The machine's ceilings, measured in a child process: the probe's large
// buffers then never count in this process's RSS columns. Falls back to
// measuring here if fork fails.
kernels::cpu::MachineCeilings CeilingsInChild(int threads) {
  int fds[2];
  if (::pipe(fds) != 0) return kernels::cpu::MeasureMachineCeilings(threads);
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return kernels::cpu::MeasureMachineCeilings(threads);
  }
  if (pid == 0) {
    ::close(fds[0]);
    const kernels::cpu::MachineCeilings c =
        kernels::cpu::MeasureMachineCeilings(threads);
    const double v[3] = {c.fma_gflops, c.read_gb_per_s, c.pair_gflops};
    const ssize_t wrote = ::write(fds[1], v, sizeof(v));
    ::_exit(wrote == sizeof(v) ? 0 : 1);
  }
  ::close(fds[1]);
  double v[3] = {0, 0, 0};
  size_t got = 0;
  while (got < sizeof(v)) {
    const ssize_t n =
        ::read(fds[0], reinterpret_cast<char*>(v) + got, sizeof(v) - got);
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (got != sizeof(v)) return kernels::cpu::MeasureMachineCeilings(threads);
  kernels::cpu::MachineCeilings c;
  c.cpu = kernels::cpu::CpuDescription();
  c.threads = threads;
  c.fma_gflops = v[0];
  c.read_gb_per_s = v[1];
  c.pair_gflops = v[2];
  return c;
}

absl::StatusOr<std::vector<int64_t>> IntList(const std::string& s,
                                             const std::string& flag,
                                             int64_t max, int64_t min = 1) {
  std::vector<int64_t> out;
  for (absl::string_view part : absl::StrSplit(s, ',', absl::SkipEmpty())) {
    int64_t v;
    if (!absl::SimpleAtoi(part, &v) || v < min || v > max) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, " wants integers in ", min, "..", max,
                       " separated by commas, got '", s, "'"));
    }
    out.push_back(v);
  }
  return out;
}

std::vector<int32_t> RandomTokens(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = static_cast<int32_t>(rng() % vocab);
  return t;
}

absl::StatusOr<double> PrefillTokensPerSecond(const ops::Model& m, int64_t n,
                                              int reps) {
  std::vector<double> rates;
  const std::vector<int32_t> tokens = RandomTokens(n, m.config().vocab_size, 1);
  for (int r = 0; r < reps; ++r) {
    ops::KvCache cache = m.NewCache();
    ops::SequenceStep step{&cache, tokens, ops::LogitsMode::kLast};
    ops::ForwardOutput out;
    const auto t0 = Clock::now();
    KVD_RETURN_IF_ERROR(m.Forward({&step, 1}, &out));
    rates.push_back(n / Seconds(t0, Clock::now()));
  }
  return Median(rates);
}

// Decode rate of `batch` sequences generating `n` tokens each after a context
// of `depth` tokens (16 when depth is 0, so the first step has something to
// attend to), prefilled in 512-token steps before the clock starts.
absl::StatusOr<double> DecodeTokensPerSecond(const ops::Model& m, int64_t batch,
                                             int64_t n, int64_t depth,
                                             int reps) {
  const int64_t kPrompt = depth > 0 ? depth : 16;
  constexpr int64_t kPrefillStep = 512;
  std::vector<double> rates;
  for (int r = 0; r < reps; ++r) {
    std::vector<ops::KvCache> caches;
    std::vector<std::vector<int32_t>> next(batch);
    for (int64_t b = 0; b < batch; ++b) caches.push_back(m.NewCache());
    std::vector<ops::SequenceStep> steps;
    std::vector<std::vector<int32_t>> prompts;
    for (int64_t b = 0; b < batch; ++b)
      prompts.push_back(RandomTokens(kPrompt, m.config().vocab_size, 100 + b));
    ops::ForwardOutput out;
    for (int64_t at = 0; at < kPrompt; at += kPrefillStep) {
      steps.clear();
      for (int64_t b = 0; b < batch; ++b) {
        const int64_t len = std::min(kPrefillStep, kPrompt - at);
        steps.push_back({&caches[b],
                         absl::MakeConstSpan(prompts[b]).subspan(at, len),
                         ops::LogitsMode::kLast, b});
      }
      KVD_RETURN_IF_ERROR(m.Forward(steps, &out));
    }
    const auto t0 = Clock::now();
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t b = 0; b < batch; ++b) {
        const float* logits = out.Logits(b);
        next[b] = {static_cast<int32_t>(
            std::max_element(logits, logits + m.config().vocab_size) - logits)};
        steps[b].tokens = next[b];
      }
      KVD_RETURN_IF_ERROR(m.Forward(steps, &out));
    }
    rates.push_back(batch * n / Seconds(t0, Clock::now()));
  }
  return Median(rates);
}

// Parameters of the matrix multiplications one token goes through: the
// layers' projections, and the output projection if `with_output`.
double MatmulParams(const ops::ModelConfig& c, bool with_output) {
  const double hd = static_cast<double>(c.head_dim);
  const double per_layer =
      c.d_model * (c.n_heads * hd + 2 * c.n_kv_heads * hd) +
      c.n_heads * hd * c.d_model + 3.0 * c.d_model * c.d_ff;
  return c.n_layers * per_layer +
         (with_output ? static_cast<double>(c.vocab_size) * c.d_model : 0);
}

absl::Status Run(const Args& args) {
  KVD_ASSIGN_OR_RETURN(std::string path, ResolveModel(args.Get("model")));
  KVD_ASSIGN_OR_RETURN(std::vector<int64_t> threads,
                       IntList(args.Get("threads"), "threads", 1024));
  // Each sequence of a batch holds its own K/V cache: 1024 of them at the
  // default lengths already take gigabytes.
  KVD_ASSIGN_OR_RETURN(std::vector<int64_t> batches,
                       IntList(args.Get("batch"), "batch", 1024));
  KVD_ASSIGN_OR_RETURN(int64_t pp, args.GetIntIn("prompt-tokens", 1, 65536));
  KVD_ASSIGN_OR_RETURN(int64_t tg, args.GetIntIn("gen-tokens", 1, 65536));
  KVD_ASSIGN_OR_RETURN(int64_t reps, args.GetIntIn("repetitions", 1, 1000));
  KVD_ASSIGN_OR_RETURN(std::vector<int64_t> depths,
                       IntList(args.Get("depth"), "depth", 1 << 20, 0));
  // The modes measured: each precision, and in fp32 each weight storage.
  struct Mode {
    ops::Precision precision;
    ops::WeightStorage storage;
    std::string name;
  };
  std::vector<ops::WeightStorage> storages;
  for (absl::string_view w :
       absl::StrSplit(args.Get("weights"), ',', absl::SkipEmpty())) {
    if (w == "as-stored") {
      storages.push_back(ops::WeightStorage::kAsStored);
    } else if (w == "converted") {
      storages.push_back(ops::WeightStorage::kDequantized);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("--weights: unknown storage '", w,
                       "'; use as-stored, converted or both"));
    }
  }
  if (storages.empty()) {
    return absl::InvalidArgumentError(
        "--weights needs as-stored, converted or both");
  }
  std::vector<Mode> modes;
  for (absl::string_view p :
       absl::StrSplit(args.Get("precision"), ',', absl::SkipEmpty())) {
    KVD_ASSIGN_OR_RETURN(const ops::Precision precision,
                         ops::ParsePrecision(p));
    for (ops::WeightStorage storage : storages) {
      modes.push_back({precision, storage,
                       absl::StrCat(ops::PrecisionName(precision),
                                    storage == ops::WeightStorage::kAsStored
                                        ? " (as stored)"
                                        : " (converted)")});
    }
  }
  // The one place a CPU-only run hears about CUDA (other commands stay
  // quiet on a machine without a device).
  const ops::DeviceProbe probe = ops::ProbeCudaDevices();
  const std::string cuda =
      probe.device_count > 0
          ? absl::StrCat(probe.device_count, " device(s), ", probe.device_name)
          : absl::StrCat("no device (", probe.detail, ")");
  std::printf(
      "model: %s\nISA: %s\nCUDA: %s (kvd bench measures the CPU engine)\n",
      path.c_str(), kernels::cpu::IsaName(kernels::cpu::ActiveIsa()),
      cuda.c_str());
  // The yardsticks, measured here and now (tables from different machines
  // are not comparable without them).
  std::map<int64_t, kernels::cpu::MachineCeilings> ceilings;
  for (int64_t t : threads) {
    ceilings[t] = CeilingsInChild(static_cast<int>(t));
    std::printf(
        "machine: %s; %lld thread(s): fp32 FMA peak %.0f GFLOP/s, bf16 pair "
        "peak %.0f GFLOP/s, memory read %.1f GB/s\n",
        ceilings[t].cpu.c_str(), static_cast<long long>(t),
        ceilings[t].fma_gflops, ceilings[t].pair_gflops,
        ceilings[t].read_gb_per_s);
  }
  std::printf(
      "\n| precision | threads | test | tok/s | of the ceiling | RSS MiB | "
      "peak RSS MiB |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (const Mode& mode : modes) {
    for (int64_t t : threads) {
      ops::LoadOptions opts;
      opts.precision = mode.precision;
      opts.weights = mode.storage;
      opts.num_threads = static_cast<int>(t);
      KVD_ASSIGN_OR_RETURN(std::unique_ptr<ops::Model> model,
                           ops::Model::Load(path, opts));
      const int64_t context = model->config().context_length;
      if (pp > context || tg > context) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--prompt-tokens (", pp, ") and --gen-tokens (", tg,
            ") must each fit the model's context of ", context, " tokens"));
      }
      for (int64_t depth : depths) {
        if (depth + tg > context) {
          return absl::InvalidArgumentError(
              absl::StrCat("--depth ", depth, " plus --gen-tokens ", tg,
                           " exceeds the model's context of ", context,
                           " tokens; use at "
                           "most --depth ",
                           context - tg));
        }
      }
      auto row = [&](const std::string& test, double rate,
                     const std::string& share) {
        const auto [rss, hwm] = MemoryMiB();
        std::printf("| %s | %lld | %s | %.1f | %s | %.0f | %.0f |\n",
                    mode.name.c_str(), static_cast<long long>(t), test.c_str(),
                    rate, share.c_str(), rss, hwm);
        std::fflush(stdout);
      };
      const kernels::cpu::MachineCeilings& ceiling = ceilings[t];
      // Prefill against the peak of the mode's products (fp32 FMA, or bf16
      // pairs; the projections' 2 FLOPs per parameter, attention not
      // counted); decode against reading every weight once per step.
      KVD_ASSIGN_OR_RETURN(double pp_rate,
                           PrefillTokensPerSecond(*model, pp, reps));
      const double pp_flops = 2 * MatmulParams(model->config(), false);
      const bool pairs = mode.precision == ops::Precision::kBf16;
      row(absl::StrFormat("pp%d", pp), pp_rate,
          absl::StrFormat(
              "%.0f%% of %s peak",
              100 * pp_rate * pp_flops /
                  ((pairs ? ceiling.pair_gflops : ceiling.fma_gflops) * 1e9),
              pairs ? "bf16 pair" : "FMA"));
      // The bytes the projections actually stream (blocks as stored, or
      // their fp32/bf16 copies); a tied output matrix is the embedding.
      const ops::ModelWeights& weights = model->weights();
      const double weight_bytes = static_cast<double>(
          weights.size_bytes() -
          (weights.output.empty() ? 0 : weights.token_embedding.size_bytes()));
      for (int64_t depth : depths) {
        for (int64_t b : batches) {
          KVD_ASSIGN_OR_RETURN(double tg_rate, DecodeTokensPerSecond(
                                                   *model, b, tg, depth, reps));
          row(absl::StrFormat("tg%d%s batch %d", tg,
                              depth > 0 ? absl::StrFormat(" @ d%d", depth) : "",
                              b),
              tg_rate,
              absl::StrFormat("%.0f%% of memory read",
                              100 * tg_rate / b * weight_bytes /
                                  (ceiling.read_gb_per_s * 1e9)));
        }
      }
    }
  }
  std::printf(
      "\npeak RSS is the process high-water mark so far (models are loaded in "
      "turn). Of the ceiling: prefill's projection FLOPs (2 per weight per "
      "token, attention not counted) against the measured peak of the mode's "
      "products (fp32 FMA; bf16 pairs, vdpbf16ps where the CPU has it); "
      "decode's "
      "weight bytes read per step against the measured memory read "
      "bandwidth.\n");
  return absl::OkStatus();
}

}  // namespace

int BenchCommand(const std::vector<std::string>& argv) {
  Args args("kvd bench",
            "Measures prefill and decode throughput (tokens/s) and memory of "
            "the CPU engine on "
            "random token ids, in llama-bench's shapes (pp = prompt "
            "processing, tg = text "
            "generation). Prints a Markdown table. (To load-test a running "
            "server: kvd bench serve --help.)");
  args.Flag("model", "smollm2",
            "GGUF file, or a cached model name: smollm2, gemma3");
  args.Flag("precision", "fp32,bf16",
            "precision modes to measure, comma-separated");
  args.Flag("weights", "as-stored",
            "how quantized weights are held, comma-separated: as-stored (the "
            "file's blocks, dequantized inside the GEMM) or converted (fp32 "
            "or bf16 copies made at load); both give the same bits");
  args.Flag("threads", "1,2", "thread counts to measure, comma-separated");
  args.Flag("batch", "1,8,32",
            "decode batch sizes (sequences decoded together)");
  args.Flag("prompt-tokens", "512", "tokens prefilled in one step");
  args.Flag("depth", "0",
            "context depths to decode at, comma-separated (llama-bench -d): "
            "that many tokens are prefilled, untimed, before each decode run");
  args.Flag("gen-tokens", "128", "tokens decoded per sequence");
  args.Flag("repetitions", "3", "runs per figure; the median is reported");
  return args.Main(argv, Run);
}

}  // namespace kvd::cli
