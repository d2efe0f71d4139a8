// `kvd plan`: the rebuild planner's table for one model, session length and
// storage tier (services/planner/planner.h), from the loaded model's measured
// rebuild paths (RecomputeKv per row, ForwardLayers per row and attention
// pair) or, with --flops-only, calibrated GEMM and attention rates
// (services/planner/calibration.h), optionally next to rebuild times measured
// on this machine with the real model (--measure).
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "base/status_macros.h"
#include "kernels/cpu/cpu_features.h"
#include "ops/kvdirect/rebuild.h"
#include "ops/kvdirect/residual_store.h"
#include "ops/model/model.h"
#include "services/planner/calibration.h"
#include "services/planner/planner.h"
#include "tools/kvd/args.h"
#include "tools/kvd/commands.h"
#include "tools/kvd/model_source.h"

namespace kvd::cli {
namespace {

using Clock = std::chrono::steady_clock;

// Rows per rebuild step (RebuildSpec::block): the GEMMs' m.
constexpr int64_t kBlock = 256;
constexpr int64_t kBandwidthFileBytes = 256 << 20;

struct Tier {
  const char* name;
  double bytes_per_s;
  const char* what;
};
constexpr Tier kTiers[] = {
    {"dram", 20e9, "host DRAM, ~20 GB/s"},
    {"disk", 2e9, "local NVMe, ~2 GB/s"},
    {"net", 1e9, "network, ~1 GB/s (about 10 GbE)"},
};

// The storage tier's read bandwidth and where the figure came from.
absl::StatusOr<std::pair<double, std::string>> Bandwidth(
    const Args& args, planner::Calibration* cal, bool* cal_changed) {
  if (args.Has("bandwidth")) {
    KVD_ASSIGN_OR_RETURN(double b, args.GetDouble("bandwidth"));
    if (!(b > 0)) return absl::InvalidArgumentError("--bandwidth must be > 0");
    return std::make_pair(b, std::string("--bandwidth"));
  }
  if (args.Has("bandwidth-dir")) {
    const std::string dir = args.Get("bandwidth-dir");
    const planner::StorageRate* s = planner::FindStorage(*cal, dir);
    if (s == nullptr) {
      KVD_ASSIGN_OR_RETURN(
          planner::StorageRate r,
          planner::MeasureReadBandwidth(dir, kBandwidthFileBytes));
      cal->storage.push_back(r);
      *cal_changed = true;
      s = &cal->storage.back();
    }
    return std::make_pair(
        s->bytes_per_s,
        absl::StrFormat("measured reading %d MiB in %s (page cache %s)",
                        s->file_bytes >> 20, dir,
                        s->cache_dropped ? "dropped: device speed"
                                         : "NOT dropped: an upper bound"));
  }
  for (const Tier& t : kTiers) {
    if (args.Get("tier") == t.name) {
      return std::make_pair(t.bytes_per_s,
                            absl::StrCat("tier ", t.name, " (", t.what, ")"));
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--tier '", args.Get("tier"), "' is not dram, disk or net"));
}

// Rebuild compute measured with the real model: a T-token session
// checkpointed at every layer, then RebuildKv into a fresh cache per policy
// (budget all) from the in-memory checkpoint. Seconds per estimate; kv is 0.
absl::StatusOr<std::vector<double>> MeasureRebuilds(
    const ops::Model& model, int64_t tokens,
    const std::vector<planner::PolicyEstimate>& estimates) {
  const ops::ModelConfig& c = model.config();
  std::mt19937 rng(1);
  std::vector<int32_t> ids(tokens);
  for (int32_t& t : ids) t = static_cast<int32_t>(rng() % c.vocab_size);
  const ops::CheckpointPolicy all{ops::CheckpointPolicy::Kind::kKvDirect, 1};
  ops::ResidualStore store(c, model.precision(),
                           ops::CheckpointLayers(all, c.n_layers));
  {
    ops::KvCache cache = model.NewCache();
    ops::ForwardOutput out;
    for (int64_t p = 0; p < tokens; p += kBlock) {
      const int64_t n = std::min(kBlock, tokens - p);
      const ops::SequenceStep step{&cache,
                                   absl::MakeConstSpan(ids).subspan(p, n),
                                   ops::LogitsMode::kNone, 0};
      KVD_RETURN_IF_ERROR(model.Forward({&step, 1}, &out, &store));
    }
    KVD_RETURN_IF_ERROR(store.status());
  }
  std::vector<double> seconds;
  for (const planner::PolicyEstimate& e : estimates) {
    if (e.policy.kind == ops::CheckpointPolicy::Kind::kKv) {
      seconds.push_back(0);
      continue;
    }
    std::fprintf(stderr, "kvd plan: measuring %s rebuild...\n",
                 e.policy.Name().c_str());
    ops::RebuildSpec spec;
    spec.policy = e.policy;
    spec.tokens = ids;
    spec.checkpoint = &store;
    spec.block = kBlock;
    ops::KvCache cache = model.NewCache();
    const Clock::time_point t0 = Clock::now();
    KVD_RETURN_IF_ERROR(ops::RebuildKv(model, spec, &cache, nullptr));
    seconds.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return seconds;
}

absl::Status Run(const Args& args) {
  KVD_ASSIGN_OR_RETURN(std::string path, ResolveModel(args.Get("model")));
  KVD_ASSIGN_OR_RETURN(ops::Precision precision,
                       ops::ParsePrecision(args.Get("precision")));
  KVD_ASSIGN_OR_RETURN(int64_t tokens, args.GetInt("tokens"));
  KVD_ASSIGN_OR_RETURN(int64_t budget, args.GetInt("budget"));
  KVD_ASSIGN_OR_RETURN(int64_t threads, args.GetIntIn("threads", 0, 1024));
  ops::LoadOptions options;
  options.precision = precision;
  options.num_threads = static_cast<int>(threads);
  KVD_ASSIGN_OR_RETURN(std::unique_ptr<ops::Model> model,
                       ops::Model::Load(path, options));
  const ops::ModelConfig& config = model->config();

  planner::Calibration cal;
  const std::string cal_path = args.Get("calibration");
  if (!cal_path.empty()) {
    absl::StatusOr<planner::Calibration> read =
        planner::ReadCalibrationFile(cal_path);
    if (read.ok()) {
      cal = *read;
    } else if (!absl::IsNotFound(read.status())) {
      return read.status();
    }
  }
  KVD_ASSIGN_OR_RETURN(
      bool cal_changed,
      planner::EnsureModelRates(config, precision, model->pool(), {}, &cal));
  if (!args.Has("flops-only")) {
    planner::CalibrationOptions path_options;
    path_options.path_block = kBlock;
    // Attention's cost per pair may grow with the context (K/V rows falling
    // out of cache): time the far block at the session's length.
    path_options.path_context = std::max<int64_t>(2 * kBlock, tokens);
    KVD_ASSIGN_OR_RETURN(bool measured_paths, planner::EnsureModelPathRates(
                                                  *model, path_options, &cal));
    cal_changed |= measured_paths;
  }
  KVD_ASSIGN_OR_RETURN(auto bandwidth, Bandwidth(args, &cal, &cal_changed));
  if (cal_changed && !cal_path.empty()) {
    KVD_RETURN_IF_ERROR(planner::WriteCalibrationFile(cal, cal_path));
  }
  const int pool_threads = model->pool()->num_threads();
  KVD_ASSIGN_OR_RETURN(planner::RebuildRates rates,
                       planner::RatesAt(cal, config, precision, pool_threads,
                                        std::min(kBlock, tokens), tokens));
  if (args.Has("flops-only")) {
    // Ignore path figures a calibration file may hold.
    rates.recompute_s_per_row = 0;
    rates.layer_s_per_row = 0;
    rates.layer_s_per_attention_pair = 0;
  }

  planner::PlanRequest request;
  request.config = config;
  request.precision = precision;
  request.tokens = tokens;
  request.read_bytes_per_s = bandwidth.first;
  request.rates = rates;
  request.budget_bytes_per_token = budget;
  request.overlap_read_and_compute = !args.Has("no-overlap");
  for (absl::string_view name :
       absl::StrSplit(args.Get("policies"), ',', absl::SkipEmpty())) {
    KVD_ASSIGN_OR_RETURN(ops::CheckpointPolicy p,
                         ops::ParseCheckpointPolicy(name));
    request.candidates.push_back(p);
  }
  KVD_ASSIGN_OR_RETURN(planner::RebuildPlan plan,
                       planner::PlanRebuild(request));

  std::vector<double> measured;
  if (args.Has("measure")) {
    KVD_ASSIGN_OR_RETURN(measured,
                         MeasureRebuilds(*model, tokens, plan.estimates));
  }

  std::printf("model: %s (%s), %s, %d threads, ISA %s\n", config.name.c_str(),
              path.c_str(), ops::PrecisionName(precision), pool_threads,
              kernels::cpu::IsaName(kernels::cpu::ActiveIsa()));
  std::printf("session: %lld tokens; read bandwidth %.3g B/s from %s\n",
              static_cast<long long>(tokens), bandwidth.first,
              bandwidth.second.c_str());
  std::printf(
      "rates (calibration%s%s): K/V projection GEMM %.1f GFLOP/s, layer GEMM "
      "%.1f GFLOP/s at m = %lld; attention %.1f GFLOP/s\n",
      cal_path.empty() ? "" : " ", cal_path.c_str(),
      rates.kv_projection_flops_per_s / 1e9, rates.layer_gemm_flops_per_s / 1e9,
      static_cast<long long>(std::min(kBlock, tokens)),
      rates.attention_flops_per_s / 1e9);
  if (rates.recompute_s_per_row > 0) {
    std::printf(
        "measured paths: RecomputeKv %.3f us/row; one layer (ForwardLayers) "
        "%.3f us/row + %.4f ns per attention pair\n",
        rates.recompute_s_per_row * 1e6, rates.layer_s_per_row * 1e6,
        rates.layer_s_per_attention_pair * 1e9);
  } else {
    std::printf("compute estimated from FLOP counts (no measured paths)\n");
  }
  std::printf("time = %s\n\n", request.overlap_read_and_compute
                                   ? "max(read, compute): pipelined"
                                   : "read + compute: not overlapped");
  std::printf(
      "| policy | bytes/token at rest | bytes read | rebuild GFLOP | est. read "
      "s | est. compute s | est. from | est. rebuild s |%s chosen |\n",
      measured.empty() ? ""
                       : " measured compute s | measured / est. compute | "
                         "measured + read s |");
  std::printf("|---|---|---|---|---|---|---|---|%s---|\n",
              measured.empty() ? "" : "---|---|---|");
  for (size_t i = 0; i < plan.estimates.size(); ++i) {
    const planner::PolicyEstimate& e = plan.estimates[i];
    std::string extra;
    if (!measured.empty()) {
      const double total = request.overlap_read_and_compute
                               ? std::max(e.read_s, measured[i])
                               : e.read_s + measured[i];
      const std::string ratio =
          e.compute_s > 0 ? absl::StrFormat("%.2f", measured[i] / e.compute_s)
                          : std::string("-");
      extra = absl::StrFormat(" %.4f | %s | %.4f |", measured[i], ratio, total);
    }
    const char* mark = static_cast<int>(i) == plan.chosen ? "**<- chosen**"
                       : e.fits_budget                    ? ""
                                                          : "over budget";
    const char* source = e.measured_compute ? "paths"
                         : e.compute_s > 0  ? "FLOPs"
                                            : "-";
    std::printf(
        "| %s | %.1f | %lld | %.3f | %.4f | %.4f | %s | %.4f |%s %s |\n",
        e.policy.Name().c_str(), e.bytes_per_token,
        static_cast<long long>(e.bytes_read), e.flops() / 1e9, e.read_s,
        e.compute_s, source, e.estimate_s, extra.c_str(), mark);
  }
  std::printf("\nchosen: %s\n",
              plan.estimates[plan.chosen].policy.Name().c_str());
  if (!measured.empty()) {
    std::printf(
        "measured compute: RebuildKv of all %lld positions from an in-memory "
        "checkpoint on this machine; \"measured + read\" adds the MODELLED "
        "read time of the tier (nothing was read from storage).\n",
        static_cast<long long>(tokens));
  }
  return absl::OkStatus();
}

}  // namespace

int PlanCommand(const std::vector<std::string>& argv) {
  Args args("kvd plan",
            "Estimates, for a session of --tokens tokens on a storage tier, "
            "how long rebuilding its K/V takes under each checkpoint policy "
            "(kv, kv-direct, stride:k, tokens) from calibrated GEMM and "
            "attention rates, and marks the fastest within --budget. See "
            "docs/PLANNER.md.");
  args.Flag("model", "smollm2",
            "GGUF file, or a cached model name: smollm2, gemma3");
  args.Flag("tokens", "1024", "session length T");
  args.Flag("tier", "dram",
            "storage tier: dram (20 GB/s), disk (2 GB/s), "
            "net (1 GB/s)");
  args.Flag("bandwidth", "", "read bandwidth in bytes/s (overrides --tier)");
  args.Flag("bandwidth-dir", "",
            "measure the read bandwidth of a 256 MiB file in this directory "
            "(overrides --tier; cached in --calibration)");
  args.Flag("budget", "0",
            "bytes per token the tier may hold for the session (0: no limit)");
  args.Flag("precision", "bf16", "fp32 or bf16");
  args.Flag("threads", "0", "threads (0: all hardware threads)");
  args.Flag("calibration", "",
            "JSON file of measured rates: read if present, measured and "
            "written if not (empty: measure, keep nothing)");
  args.Switch("measure",
              "also time RebuildKv per policy with the real model on this "
              "machine");
  args.Flag("policies", "",
            "candidate policies, comma-separated (e.g. kv,kv-direct,tokens); "
            "empty: kv, kv-direct, stride:{2,3,4,6,8,12}, tokens");
  args.Switch("flops-only",
              "estimate compute from FLOP counts only (do not time the "
              "model's RecomputeKv / ForwardLayers)");
  args.Switch("no-overlap",
              "model reading and recomputing as sequential, not pipelined");
  return args.Main(argv, Run);
}

}  // namespace kvd::cli
