#include "services/planner/auto_policy.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "services/planner/calibration.h"

namespace kvd::planner {
namespace {

constexpr int64_t kBandwidthFileBytes = int64_t{64} << 20;
// The rebuild's block (ops/kvdirect/rebuild.h RebuildSpec::block).
constexpr int64_t kBlock = 256;

}  // namespace

absl::StatusOr<AutoPolicy> ChooseCheckpointPolicy(
    const ops::Model& model, const AutoPolicyOptions& options) {
  const ops::ModelConfig& config = model.config();
  const ops::Precision precision = model.precision();
  const int64_t tokens =
      std::clamp<int64_t>(options.tokens, 1, config.context_length);
  Calibration cal;
  if (!options.calibration_path.empty()) {
    absl::StatusOr<Calibration> read =
        ReadCalibrationFile(options.calibration_path);
    if (read.ok()) {
      cal = *std::move(read);
    } else if (!absl::IsNotFound(read.status())) {
      return read.status();
    }
  }
  KVD_ASSIGN_OR_RETURN(bool measured, EnsureModelRates(config, precision,
                                                       model.pool(), {}, &cal));
  CalibrationOptions paths;
  paths.path_block = kBlock;
  paths.path_context = std::max<int64_t>(2 * kBlock, tokens);
  KVD_ASSIGN_OR_RETURN(bool measured_paths,
                       EnsureModelPathRates(model, paths, &cal));
  measured |= measured_paths;
  const StorageRate* storage = FindStorage(cal, options.storage_dir);
  if (storage == nullptr) {
    KVD_ASSIGN_OR_RETURN(
        StorageRate rate,
        MeasureReadBandwidth(options.storage_dir, kBandwidthFileBytes));
    cal.storage.push_back(rate);
    storage = &cal.storage.back();
    measured = true;
  }
  if (measured && !options.calibration_path.empty()) {
    KVD_RETURN_IF_ERROR(WriteCalibrationFile(cal, options.calibration_path));
  }

  PlanRequest request;
  request.config = config;
  request.precision = precision;
  request.tokens = tokens;
  request.read_bytes_per_s = storage->bytes_per_s;
  KVD_ASSIGN_OR_RETURN(
      request.rates,
      RatesAt(cal, config, precision, model.pool()->num_threads(),
              std::min(kBlock, tokens), tokens));
  request.budget_bytes_per_token = options.budget_bytes_per_token;
  // The engine streams residual checkpoints into the rebuild, but reading
  // costs CPU too: on 2 cores measured resumes overlapped only partly
  // (docs/PLANNER.md, "Resume: measured"), so plan without the overlap.
  request.overlap_read_and_compute = false;
  for (const ops::CheckpointPolicy& p : DefaultCandidates(config.n_layers)) {
    if (p.kind == ops::CheckpointPolicy::Kind::kKv && !options.kv_candidate)
      continue;
    request.candidates.push_back(p);
  }
  AutoPolicy out;
  KVD_ASSIGN_OR_RETURN(out.plan, PlanRebuild(request));
  out.policy = out.plan.estimates[out.plan.chosen].policy;
  out.read_bytes_per_s = storage->bytes_per_s;
  out.measured_now = measured;
  out.summary = absl::StrFormat(
      "policy auto: %s (modelled resume of a %d-token session read at %.2f "
      "GB/s from %s:",
      out.policy.Name(), tokens, storage->bytes_per_s / 1e9,
      options.storage_dir);
  for (const PolicyEstimate& e : out.plan.estimates) {
    absl::StrAppendFormat(&out.summary, " %s %.3f s%s", e.policy.Name(),
                          e.estimate_s, e.fits_budget ? "" : " (over budget)");
  }
  absl::StrAppend(&out.summary, measured ? "; measured now" : "; rates from ",
                  measured ? "" : options.calibration_path, ")");
  return out;
}

}  // namespace kvd::planner
