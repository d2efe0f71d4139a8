// Calibration for the rebuild planner: measured GEMM and attention throughput
// at a model's shapes, the measured cost of the model's own rebuild paths
// (Model::RecomputeKv per row, one layer of Model::ForwardLayers per row and
// per attention pair), and read bandwidth of a storage directory, cached in a
// small JSON file so a node measures once and reads the figures at start-up.
//
// The file holds four lists; an entry is reused when its key matches
// (GEMM: weight dtype, n, k, m, threads; attention: dtype, group, head_dim,
// keys, threads; model path: model name and shape, precision, threads, block;
// storage: directory). EnsureModelRates / EnsureModelPathRates measure only
// what is missing, so one file serves several models and thread counts:
//
//   Calibration cal;
//   absl::StatusOr<Calibration> read = ReadCalibrationFile(path);
//   if (read.ok()) cal = *read;                  // NOT_FOUND: start empty
//   KVD_ASSIGN_OR_RETURN(bool measured,
//       EnsureModelRates(config, precision, model->pool(), {}, &cal));
//   KVD_ASSIGN_OR_RETURN(bool measured_path,
//       EnsureModelPathRates(*model, {}, &cal));  // needs the loaded model
//   if (measured || measured_path)
//     KVD_RETURN_IF_ERROR(WriteCalibrationFile(cal, path));
//   KVD_ASSIGN_OR_RETURN(RebuildRates rates,
//       RatesAt(cal, config, precision, threads, /*m=*/256, /*keys=*/T));
//
// With a model-path entry RatesAt fills the planner's measured per-row costs
// (the planner then prefers them to its FLOP count); without one (no model
// loaded, or an old file) they stay 0 and the planner counts FLOPs.
// Figures are whatever this machine did when measured (shared machines move
// them by several percent, more under load); nothing here asserts a speed.
//
// Thread-safety: the measurements use the given pool, so one at a time per
// pool; the rest are pure functions.
#ifndef KVD_SERVICES_PLANNER_CALIBRATION_H_
#define KVD_SERVICES_PLANNER_CALIBRATION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/cpu/thread_pool.h"
#include "ops/model/model.h"
#include "ops/model/model_config.h"
#include "services/planner/planner.h"

namespace kvd::planner {

struct GemmRate {
  std::string weights;  // "fp32" or "bf16" (PrecisionName)
  int64_t n = 0;        // output features
  int64_t k = 0;        // inputs
  int64_t m = 0;        // rows (tokens) per call
  int threads = 0;
  double flops_per_s = 0;  // 2 m n k per call
};

struct AttentionRate {
  std::string kv;     // K/V storage dtype, "fp32" or "bf16"
  int64_t group = 0;  // query heads per K/V head
  int64_t head_dim = 0;
  int64_t keys = 0;  // context length the queries attend over
  int threads = 0;
  double flops_per_s = 0;  // 4 x group x head_dim per (query, key) pair
};

// The model's own rebuild paths, timed on the loaded model in its precision
// (EnsureModelPathRates). `layer` is the first global (non-sliding-window)
// layer, so its attention sees every earlier position.
struct ModelPathRate {
  // Key: the model's name and shape, its precision, threads, rows per call.
  std::string model;
  int64_t n_layers = 0, d_model = 0, kv_dim = 0, d_ff = 0;
  std::string precision;  // PrecisionName
  int threads = 0;
  int64_t block = 0;  // rows per RecomputeKv / ForwardLayers call
  int64_t layer = 0;
  // Model::RecomputeKv of `recompute_rows` rows in calls of `block` rows:
  // seconds per row, the median of the repeats.
  int64_t recompute_rows = 0;
  double recompute_s_per_row = 0;
  // Model::ForwardLayers of `layer` alone over one block at positions
  // [0, block) (near) and [context - block, context) (far), seconds (median).
  int64_t context = 0;
  double layer_near_s = 0;
  double layer_far_s = 0;
};

// A full layer's time for R rows attending P (query, key) pairs, fitted as
// R x per_row + P x per_pair through a ModelPathRate's two block timings
// (both coefficients clamped at >= 0 against noise).
struct LayerCost {
  double per_row_s = 0;
  double per_pair_s = 0;
};
LayerCost FitLayerCost(const ModelPathRate& rate);

struct StorageRate {
  std::string directory;
  int64_t file_bytes = 0;
  double bytes_per_s = 0;
  // Whether the file was out of the page cache when read back
  // (posix_fadvise(DONTNEED), checked with mincore). False: the figure is
  // (partly) a page-cache read, an upper bound for the device.
  bool cache_dropped = false;
};

struct Calibration {
  std::vector<GemmRate> gemm;
  std::vector<AttentionRate> attention;
  std::vector<StorageRate> storage;
  std::vector<ModelPathRate> model_paths;
};

struct CalibrationOptions {
  std::vector<int64_t> ms = {1, 64, 512};  // GEMM row counts to measure
  int64_t attention_keys = 1024;
  double min_seconds = 0.2;  // timed time per figure (after one warm-up call)
  // Model paths (EnsureModelPathRates): rows per call (the rebuild's block),
  // rows recomputed per repeat, the far block's end position (clamped to the
  // model's context; the session length being planned for is the best
  // choice) and repeats per figure (the median is kept).
  int64_t path_block = 256;
  int64_t recompute_rows = 1024;
  int64_t path_context = 1024;
  int path_repeats = 5;
};

// JSON round trip. INVALID_ARGUMENT names `source` and the bad field.
std::string CalibrationToJson(const Calibration& calibration);
absl::StatusOr<Calibration> CalibrationFromJson(absl::string_view json,
                                                absl::string_view source);
// NOT_FOUND if the file does not exist; INVALID_ARGUMENT if it is not a
// calibration file.
absl::StatusOr<Calibration> ReadCalibrationFile(const std::string& path);
absl::Status WriteCalibrationFile(const Calibration& calibration,
                                  const std::string& path);

// y = x W^T with W n x k in `weights` ("fp32"/"bf16") for m rows, on `pool`.
absl::StatusOr<double> MeasureGemmFlops(absl::string_view weights, int64_t n,
                                        int64_t k, int64_t m,
                                        kernels::cpu::ThreadPool* pool,
                                        double min_seconds);
// Causal attention (kernels::cpu::AttendCausalBlock) of 64-query blocks over
// `keys` positions, one block per pool thread at a time.
absl::StatusOr<double> MeasureAttentionFlops(absl::string_view kv,
                                             int64_t group, int64_t head_dim,
                                             int64_t keys,
                                             kernels::cpu::ThreadPool* pool,
                                             double min_seconds);
// Writes a file of `file_bytes` in `directory`, syncs it, asks the kernel to
// drop it from the page cache, reads it back sequentially timing the read,
// and deletes it (storage::MeasureDiskReadBandwidth,
// storage/probe/disk_bandwidth.h), and records the figure under `directory`.
// INVALID_ARGUMENT / the OS error if the directory is not writable.
absl::StatusOr<StorageRate> MeasureReadBandwidth(const std::string& directory,
                                                 int64_t file_bytes);

// Measures the GEMM shapes of the model's layers (K/V projection: kv_dim x
// d_model; the rest: d_ff x d_model) at options.ms and its attention, unless
// `calibration` already has them for pool->num_threads(). Returns whether it
// measured anything (then the caller may write the file back).
absl::StatusOr<bool> EnsureModelRates(const ops::ModelConfig& config,
                                      ops::Precision precision,
                                      kernels::cpu::ThreadPool* pool,
                                      const CalibrationOptions& options,
                                      Calibration* calibration);

// Times the loaded model's rebuild paths (ModelPathRate) unless `calibration`
// already has them for this model, precision, thread count,
// options.path_block and context (options.path_context clamped to the
// model's). Returns whether it measured (then write the file back). A caller
// planning for T tokens passes path_context = T: the attention pair cost
// grows with the context (longer K/V rows fall out of cache).
// Takes well under a second for SmolLM2 on 2 cores.
absl::StatusOr<bool> EnsureModelPathRates(const ops::Model& model,
                                          const CalibrationOptions& options,
                                          Calibration* calibration);

// The planner's rates at m rows per GEMM, interpolated linearly in log m
// between the measured row counts (clamped at the ends); attention at the
// measured key count nearest `keys`; the measured path costs from the
// model-path entry whose block is nearest m and context nearest `keys`, if
// any (else left 0).
// FAILED_PRECONDITION if the calibration lacks the model's GEMM or attention
// shapes for `threads`.
absl::StatusOr<RebuildRates> RatesAt(const Calibration& calibration,
                                     const ops::ModelConfig& config,
                                     ops::Precision precision, int threads,
                                     int64_t m, int64_t keys);

// The stored storage entry for `directory`, or null.
const StorageRate* FindStorage(const Calibration& calibration,
                               absl::string_view directory);

}  // namespace kvd::planner

#endif  // KVD_SERVICES_PLANNER_CALIBRATION_H_
