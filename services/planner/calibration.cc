#include "services/planner/calibration.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/gemm.h"
#include "nlohmann/json.hpp"
#include "storage/probe/disk_bandwidth.h"

namespace kvd::planner {

using ops::KvCache;
using ops::Model;
using ops::ModelConfig;
using ops::Precision;
using ops::PrecisionName;

namespace {

using Clock = std::chrono::steady_clock;
using kernels::cpu::WeightType;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

absl::StatusOr<WeightType> ParseDtype(absl::string_view name) {
  if (name == "fp32") return WeightType::kF32;
  if (name == "bf16") return WeightType::kBf16;
  return absl::InvalidArgumentError(
      absl::StrCat("calibration: dtype '", name, "' is not fp32 or bf16"));
}

// Runs `fn` once to warm up, then until `min_seconds` have passed; returns
// `flops_per_call` x calls / seconds.
template <typename Fn>
double Rate(double flops_per_call, double min_seconds, Fn fn) {
  fn();
  int64_t calls = 0;
  const Clock::time_point t0 = Clock::now();
  double elapsed = 0;
  do {
    fn();
    ++calls;
    elapsed = Since(t0);
  } while (elapsed < min_seconds);
  return flops_per_call * calls / elapsed;
}

absl::Status Errno(absl::string_view what, const std::string& path) {
  return absl::UnknownError(absl::StrCat("calibration: ", what, " ", path, ": ",
                                         std::strerror(errno)));
}

template <typename T>
absl::Status Get(const nlohmann::json& j, const char* key,
                 absl::string_view source, T* out) {
  if (!j.is_object() || !j.contains(key)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "calibration file ", source, ": an entry lacks '", key, "'"));
  }
  try {
    *out = j.at(key).get<T>();
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        "calibration file ", source, ": '", key, "' has the wrong type"));
  }
  return absl::OkStatus();
}

bool SaneRate(double r) { return std::isfinite(r) && r > 0; }

const GemmRate* FindGemm(const Calibration& c, absl::string_view weights,
                         int64_t n, int64_t k, int64_t m, int threads) {
  for (const GemmRate& g : c.gemm) {
    if (g.weights == weights && g.n == n && g.k == k && g.m == m &&
        g.threads == threads) {
      return &g;
    }
  }
  return nullptr;
}

const AttentionRate* FindAttention(const Calibration& c, absl::string_view kv,
                                   int64_t group, int64_t head_dim,
                                   int64_t keys, int threads) {
  const AttentionRate* best = nullptr;
  for (const AttentionRate& a : c.attention) {
    if (a.kv != kv || a.group != group || a.head_dim != head_dim ||
        a.threads != threads) {
      continue;
    }
    if (best == nullptr ||
        std::abs(std::log(static_cast<double>(a.keys) / keys)) <
            std::abs(std::log(static_cast<double>(best->keys) / keys))) {
      best = &a;
    }
  }
  return best;
}

// A model-path entry for this model, precision and thread count, with the
// block nearest `block` and the context nearest `context` (distances in log,
// added); null if none.
const ModelPathRate* FindModelPath(const Calibration& c,
                                   const ModelConfig& config,
                                   absl::string_view precision, int threads,
                                   int64_t block, int64_t context) {
  const ModelPathRate* best = nullptr;
  double best_distance = 0;
  for (const ModelPathRate& r : c.model_paths) {
    if (r.model != config.name || r.n_layers != config.n_layers ||
        r.d_model != config.d_model || r.kv_dim != config.kv_dim() ||
        r.d_ff != config.d_ff || r.precision != precision ||
        r.threads != threads) {
      continue;
    }
    const double distance =
        std::abs(std::log(static_cast<double>(r.block) / block)) +
        std::abs(std::log(static_cast<double>(r.context) / context));
    if (best == nullptr || distance < best_distance) {
      best = &r;
      best_distance = distance;
    }
  }
  return best;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// (query, key) pairs of causal attention for queries [p0, p0 + n).
double CausalPairs(int64_t p0, int64_t n) {
  return static_cast<double>(n) * p0 + static_cast<double>(n) * (n + 1) / 2;
}

// The rate at m rows for shape (n, k): linear in log m between the nearest
// measured row counts, clamped outside them.
absl::StatusOr<double> GemmAt(const Calibration& c, absl::string_view weights,
                              int64_t n, int64_t k, int threads, int64_t m,
                              absl::string_view what) {
  std::vector<const GemmRate*> points;
  for (const GemmRate& g : c.gemm) {
    if (g.weights == weights && g.n == n && g.k == k && g.threads == threads) {
      points.push_back(&g);
    }
  }
  if (points.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "calibration has no ", weights, " GEMM rate for the ", what, " (", n,
        " x ", k, ") at ", threads, " threads; calibrate this model first"));
  }
  std::sort(points.begin(), points.end(),
            [](const GemmRate* a, const GemmRate* b) { return a->m < b->m; });
  if (m <= points.front()->m) return points.front()->flops_per_s;
  if (m >= points.back()->m) return points.back()->flops_per_s;
  for (size_t i = 1; i < points.size(); ++i) {
    if (m <= points[i]->m) {
      const double a = std::log(static_cast<double>(points[i - 1]->m));
      const double b = std::log(static_cast<double>(points[i]->m));
      const double w = (std::log(static_cast<double>(m)) - a) / (b - a);
      return points[i - 1]->flops_per_s * (1 - w) + points[i]->flops_per_s * w;
    }
  }
  return points.back()->flops_per_s;
}

}  // namespace

LayerCost FitLayerCost(const ModelPathRate& r) {
  LayerCost cost;
  if (r.block < 1) return cost;
  const double near_pairs = CausalPairs(0, r.block);
  const double far_pairs = CausalPairs(r.context - r.block, r.block);
  if (far_pairs > near_pairs) {
    cost.per_pair_s = std::max(
        0.0, (r.layer_far_s - r.layer_near_s) / (far_pairs - near_pairs));
  }
  cost.per_row_s =
      std::max(0.0, (r.layer_near_s - cost.per_pair_s * near_pairs) / r.block);
  if (cost.per_row_s == 0 && cost.per_pair_s == 0) {
    // Both clamped: fall back to the near block's time, all per row.
    cost.per_row_s = std::max(0.0, r.layer_near_s / r.block);
  }
  return cost;
}

std::string CalibrationToJson(const Calibration& c) {
  nlohmann::json j;
  j["version"] = 1;
  j["gemm"] = nlohmann::json::array();
  for (const GemmRate& g : c.gemm) {
    j["gemm"].push_back({{"weights", g.weights},
                         {"n", g.n},
                         {"k", g.k},
                         {"m", g.m},
                         {"threads", g.threads},
                         {"flops_per_s", g.flops_per_s}});
  }
  j["attention"] = nlohmann::json::array();
  for (const AttentionRate& a : c.attention) {
    j["attention"].push_back({{"kv", a.kv},
                              {"group", a.group},
                              {"head_dim", a.head_dim},
                              {"keys", a.keys},
                              {"threads", a.threads},
                              {"flops_per_s", a.flops_per_s}});
  }
  j["model_paths"] = nlohmann::json::array();
  for (const ModelPathRate& r : c.model_paths) {
    j["model_paths"].push_back({{"model", r.model},
                                {"n_layers", r.n_layers},
                                {"d_model", r.d_model},
                                {"kv_dim", r.kv_dim},
                                {"d_ff", r.d_ff},
                                {"precision", r.precision},
                                {"threads", r.threads},
                                {"block", r.block},
                                {"layer", r.layer},
                                {"recompute_rows", r.recompute_rows},
                                {"recompute_s_per_row", r.recompute_s_per_row},
                                {"context", r.context},
                                {"layer_near_s", r.layer_near_s},
                                {"layer_far_s", r.layer_far_s}});
  }
  j["storage"] = nlohmann::json::array();
  for (const StorageRate& s : c.storage) {
    j["storage"].push_back({{"directory", s.directory},
                            {"file_bytes", s.file_bytes},
                            {"bytes_per_s", s.bytes_per_s},
                            {"cache_dropped", s.cache_dropped}});
  }
  return j.dump(2) + "\n";
}

absl::StatusOr<Calibration> CalibrationFromJson(absl::string_view json,
                                                absl::string_view source) {
  nlohmann::json j = nlohmann::json::parse(json.begin(), json.end(), nullptr,
                                           /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("calibration file ", source,
                     " is not a JSON object; delete it to "
                     "re-measure"));
  }
  int version = 0;
  if (absl::Status s = Get(j, "version", source, &version); !s.ok()) return s;
  if (version != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("calibration file ", source, " has version ", version,
                     "; this build reads version 1 (delete it to re-measure)"));
  }
  Calibration c;
  auto list = [&](const char* key) {
    return j.contains(key) && j[key].is_array() ? j[key]
                                                : nlohmann::json::array();
  };
  for (const nlohmann::json& e : list("gemm")) {
    GemmRate g;
    for (absl::Status s :
         {Get(e, "weights", source, &g.weights), Get(e, "n", source, &g.n),
          Get(e, "k", source, &g.k), Get(e, "m", source, &g.m),
          Get(e, "threads", source, &g.threads),
          Get(e, "flops_per_s", source, &g.flops_per_s)}) {
      if (!s.ok()) return s;
    }
    if (!SaneRate(g.flops_per_s) || g.n < 1 || g.k < 1 || g.m < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "calibration file ", source, ": a GEMM entry is out of range"));
    }
    c.gemm.push_back(g);
  }
  for (const nlohmann::json& e : list("attention")) {
    AttentionRate a;
    for (absl::Status s :
         {Get(e, "kv", source, &a.kv), Get(e, "group", source, &a.group),
          Get(e, "head_dim", source, &a.head_dim),
          Get(e, "keys", source, &a.keys),
          Get(e, "threads", source, &a.threads),
          Get(e, "flops_per_s", source, &a.flops_per_s)}) {
      if (!s.ok()) return s;
    }
    if (!SaneRate(a.flops_per_s) || a.keys < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "calibration file ", source, ": an attention entry is out of range"));
    }
    c.attention.push_back(a);
  }
  for (const nlohmann::json& e : list("model_paths")) {
    ModelPathRate r;
    for (absl::Status s :
         {Get(e, "model", source, &r.model),
          Get(e, "n_layers", source, &r.n_layers),
          Get(e, "d_model", source, &r.d_model),
          Get(e, "kv_dim", source, &r.kv_dim), Get(e, "d_ff", source, &r.d_ff),
          Get(e, "precision", source, &r.precision),
          Get(e, "threads", source, &r.threads),
          Get(e, "block", source, &r.block), Get(e, "layer", source, &r.layer),
          Get(e, "recompute_rows", source, &r.recompute_rows),
          Get(e, "recompute_s_per_row", source, &r.recompute_s_per_row),
          Get(e, "context", source, &r.context),
          Get(e, "layer_near_s", source, &r.layer_near_s),
          Get(e, "layer_far_s", source, &r.layer_far_s)}) {
      if (!s.ok()) return s;
    }
    if (!SaneRate(r.recompute_s_per_row) || !SaneRate(r.layer_near_s) ||
        !SaneRate(r.layer_far_s) || r.block < 1 || r.context < r.block ||
        r.recompute_rows < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "calibration file ", source, ": the model-path entry of ", r.model,
          " is out of range (delete it to re-measure)"));
    }
    c.model_paths.push_back(r);
  }
  for (const nlohmann::json& e : list("storage")) {
    StorageRate s;
    for (absl::Status st :
         {Get(e, "directory", source, &s.directory),
          Get(e, "file_bytes", source, &s.file_bytes),
          Get(e, "bytes_per_s", source, &s.bytes_per_s),
          Get(e, "cache_dropped", source, &s.cache_dropped)}) {
      if (!st.ok()) return st;
    }
    if (!SaneRate(s.bytes_per_s)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "calibration file ", source, ": a storage entry is out of range"));
    }
    c.storage.push_back(s);
  }
  return c;
}

absl::StatusOr<Calibration> ReadCalibrationFile(const std::string& path) {
  std::ifstream f(path);
  if (!f) {
    return absl::NotFoundError(
        absl::StrCat("calibration file ", path, " does not exist"));
  }
  std::stringstream text;
  text << f.rdbuf();
  return CalibrationFromJson(text.str(), path);
}

absl::Status WriteCalibrationFile(const Calibration& c,
                                  const std::string& path) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << CalibrationToJson(c);
    if (!f.good()) return Errno("cannot write", tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return Errno("cannot rename to", path);
  }
  return absl::OkStatus();
}

absl::StatusOr<double> MeasureGemmFlops(absl::string_view weights, int64_t n,
                                        int64_t k, int64_t m,
                                        kernels::cpu::ThreadPool* pool,
                                        double min_seconds) {
  absl::StatusOr<WeightType> type = ParseDtype(weights);
  if (!type.ok()) return type.status();
  if (n < 1 || k < 1 || m < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "calibration: GEMM shape ", m, " x ", n, " x ", k, " is empty"));
  }
  std::vector<float> x(m * k, 0.5f), y(m * n), w32;
  std::vector<uint16_t> w16;
  kernels::cpu::WeightView w{*type, nullptr, n, k};
  // "bf16" is the bf16 mode's GEMM: bf16 weights and pair products.
  w.bf16_pairs = *type == WeightType::kBf16;
  if (*type == WeightType::kF32) {
    w32.assign(n * k, 0.25f);
    w.data = w32.data();
  } else {
    w16.assign(n * k, kernels::cpu::FloatToBf16(0.25f));
    w.data = w16.data();
  }
  return Rate(2.0 * m * n * k, min_seconds, [&] {
    kernels::cpu::Gemm(x.data(), m, k, w, y.data(), n, pool);
  });
}

absl::StatusOr<double> MeasureAttentionFlops(absl::string_view kv,
                                             int64_t group, int64_t head_dim,
                                             int64_t keys,
                                             kernels::cpu::ThreadPool* pool,
                                             double min_seconds) {
  absl::StatusOr<WeightType> type = ParseDtype(kv);
  if (!type.ok()) return type.status();
  constexpr int64_t kBlock = 64;
  if (group < 1 || head_dim < 1 || keys < kBlock) {
    return absl::InvalidArgumentError(absl::StrCat(
        "calibration: attention shape group ", group, " head_dim ", head_dim,
        " keys ", keys, " is too small (keys >= ", kBlock, ")"));
  }
  const int64_t elem = *type == WeightType::kF32 ? 4 : 2;
  std::vector<uint8_t> k_rows(keys * head_dim * elem), v_rows(k_rows.size());
  if (*type == WeightType::kF32) {
    float* kf = reinterpret_cast<float*>(k_rows.data());
    float* vf = reinterpret_cast<float*>(v_rows.data());
    for (int64_t i = 0; i < keys * head_dim; ++i) {
      kf[i] = 0.01f * (i % 17);
      vf[i] = 0.02f * (i % 11);
    }
  } else {
    uint16_t* kb = reinterpret_cast<uint16_t*>(k_rows.data());
    uint16_t* vb = reinterpret_cast<uint16_t*>(v_rows.data());
    for (int64_t i = 0; i < keys * head_dim; ++i) {
      kb[i] = kernels::cpu::FloatToBf16(0.01f * (i % 17));
      vb[i] = kernels::cpu::FloatToBf16(0.02f * (i % 11));
    }
  }
  const kernels::cpu::KvRows k{*type, k_rows.data(), head_dim};
  const kernels::cpu::KvRows v{*type, v_rows.data(), head_dim};
  const int64_t tasks = pool->num_threads();
  const int64_t row = group * head_dim;
  std::vector<float> q(kBlock * row, 0.1f), out(tasks * kBlock * row);
  const int64_t pos0 = keys - kBlock;
  double pairs = 0;
  for (int64_t i = 0; i < kBlock; ++i) pairs += pos0 + i + 1;
  const double flops = 4.0 * group * head_dim * pairs * tasks;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  return Rate(flops, min_seconds, [&] {
    pool->ParallelFor(tasks, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        kernels::cpu::AttendCausalBlock(q.data(), row, kBlock, group, head_dim,
                                        scale, k, v, pos0, /*window=*/0,
                                        out.data() + t * kBlock * row, row);
      }
    });
  });
}

absl::StatusOr<StorageRate> MeasureReadBandwidth(const std::string& directory,
                                                 int64_t file_bytes) {
  absl::StatusOr<storage::DiskReadBandwidth> b =
      storage::MeasureDiskReadBandwidth(directory, file_bytes);
  if (!b.ok()) {
    return absl::Status(b.status().code(),
                        absl::StrCat("calibration: ", b.status().message()));
  }
  StorageRate rate;
  rate.directory = directory;
  rate.file_bytes = b->file_bytes;
  rate.bytes_per_s = b->bytes_per_s;
  rate.cache_dropped = b->cache_dropped;
  return rate;
}

absl::StatusOr<bool> EnsureModelRates(const ModelConfig& config,
                                      Precision precision,
                                      kernels::cpu::ThreadPool* pool,
                                      const CalibrationOptions& options,
                                      Calibration* calibration) {
  const std::string dtype = PrecisionName(precision);
  const int threads = pool->num_threads();
  bool measured = false;
  const std::pair<int64_t, int64_t> shapes[] = {
      {config.kv_dim(), config.d_model}, {config.d_ff, config.d_model}};
  for (const auto& [n, k] : shapes) {
    for (int64_t m : options.ms) {
      if (FindGemm(*calibration, dtype, n, k, m, threads) != nullptr) continue;
      absl::StatusOr<double> r =
          MeasureGemmFlops(dtype, n, k, m, pool, options.min_seconds);
      if (!r.ok()) return r.status();
      calibration->gemm.push_back({dtype, n, k, m, threads, *r});
      measured = true;
    }
  }
  const int64_t group =
      config.n_heads / std::max<int64_t>(1, config.n_kv_heads);
  const AttentionRate* a =
      FindAttention(*calibration, dtype, group, config.head_dim,
                    options.attention_keys, threads);
  if (a == nullptr || a->keys != options.attention_keys) {
    absl::StatusOr<double> r = MeasureAttentionFlops(
        dtype, group, config.head_dim, options.attention_keys, pool,
        options.min_seconds);
    if (!r.ok()) return r.status();
    calibration->attention.push_back(
        {dtype, group, config.head_dim, options.attention_keys, threads, *r});
    measured = true;
  }
  return measured;
}

absl::StatusOr<bool> EnsureModelPathRates(const Model& model,
                                          const CalibrationOptions& options,
                                          Calibration* calibration) {
  const ModelConfig& c = model.config();
  const std::string precision = PrecisionName(model.precision());
  const int threads = model.pool()->num_threads();
  if (options.path_block < 1 || options.recompute_rows < 1 ||
      options.path_repeats < 1 || options.path_context < 1) {
    return absl::InvalidArgumentError(
        "calibration: model-path block, rows, context and repeats must be "
        ">= 1");
  }
  const int64_t context = std::min(options.path_context, c.context_length);
  const int64_t block =
      std::min(options.path_block, std::max<int64_t>(1, context / 2));
  const ModelPathRate* have =
      FindModelPath(*calibration, c, precision, threads, block, context);
  if (have != nullptr && have->block == block && have->context == context) {
    return false;
  }
  ModelPathRate r;
  r.model = c.name;
  r.n_layers = c.n_layers;
  r.d_model = c.d_model;
  r.kv_dim = c.kv_dim();
  r.d_ff = c.d_ff;
  r.precision = precision;
  r.threads = threads;
  r.context = context;
  r.block = block;
  r.recompute_rows = std::max(options.recompute_rows, r.block);
  r.layer = 0;
  while (r.layer + 1 < c.n_layers && c.layers[r.layer].sliding_window != 0)
    ++r.layer;

  // Residual-like inputs: any finite values time the same.
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> h(r.recompute_rows * c.d_model);
  for (float& x : h) x = uniform(rng);

  // RecomputeKv in calls of `block` rows, as RebuildKv makes them.
  KvCache probe = model.NewCache();
  std::vector<uint8_t> k_out(r.block * probe.row_bytes()), v_out(k_out.size());
  std::vector<int64_t> positions(r.recompute_rows);
  for (int64_t i = 0; i < r.recompute_rows; ++i)
    positions[i] = i % c.context_length;
  auto recompute_all = [&]() -> absl::Status {
    for (int64_t p = 0; p < r.recompute_rows; p += r.block) {
      const int64_t n = std::min(r.block, r.recompute_rows - p);
      absl::Status s = model.RecomputeKv(r.layer, h.data() + p * c.d_model,
                                         positions.data() + p, n, k_out.data(),
                                         v_out.data(), model.pool());
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  };
  if (absl::Status s = recompute_all(); !s.ok()) return s;  // warm-up
  std::vector<double> times;
  for (int i = 0; i < options.path_repeats; ++i) {
    const Clock::time_point t0 = Clock::now();
    if (absl::Status s = recompute_all(); !s.ok()) return s;
    times.push_back(Since(t0) / r.recompute_rows);
  }
  r.recompute_s_per_row = Median(times);

  // ForwardLayers of one layer over a block at [p, p + block); the cache
  // holds the layer's rows below p from earlier calls.
  KvCache cache = model.NewCache();
  std::vector<float> block_h(r.block * c.d_model);
  auto layer_block = [&](int64_t p, double* seconds) -> absl::Status {
    std::copy(h.begin(), h.begin() + block_h.size(), block_h.begin());
    const Clock::time_point t0 = Clock::now();
    absl::Status s = model.ForwardLayers(&cache, p, r.block, r.layer,
                                         r.layer + 1, block_h.data());
    *seconds = Since(t0);
    return s;
  };
  double unused = 0;
  const int64_t far = r.context - r.block;
  for (int64_t p = 0; p <= far; p += r.block) {  // fills rows, warms up
    if (absl::Status s = layer_block(p, &unused); !s.ok()) return s;
  }
  std::vector<double> near, far_times;
  for (int i = 0; i < options.path_repeats; ++i) {
    double t = 0;
    if (absl::Status s = layer_block(0, &t); !s.ok()) return s;
    near.push_back(t);
    if (absl::Status s = layer_block(far, &t); !s.ok()) return s;
    far_times.push_back(t);
  }
  r.layer_near_s = Median(near);
  r.layer_far_s = Median(far_times);
  if (!SaneRate(r.recompute_s_per_row) || !SaneRate(r.layer_near_s) ||
      !SaneRate(r.layer_far_s)) {
    return absl::InternalError(
        absl::StrCat("calibration: timing ", c.name,
                     "'s rebuild paths gave a non-positive figure"));
  }
  calibration->model_paths.push_back(r);
  return true;
}

absl::StatusOr<RebuildRates> RatesAt(const Calibration& calibration,
                                     const ModelConfig& config,
                                     Precision precision, int threads,
                                     int64_t m, int64_t keys) {
  const std::string dtype = PrecisionName(precision);
  RebuildRates rates;
  absl::StatusOr<double> kv =
      GemmAt(calibration, dtype, config.kv_dim(), config.d_model, threads, m,
             "K/V projection");
  if (!kv.ok()) return kv.status();
  absl::StatusOr<double> layer = GemmAt(calibration, dtype, config.d_ff,
                                        config.d_model, threads, m, "MLP");
  if (!layer.ok()) return layer.status();
  const int64_t group =
      config.n_heads / std::max<int64_t>(1, config.n_kv_heads);
  const AttentionRate* a =
      FindAttention(calibration, dtype, group, config.head_dim, keys, threads);
  if (a == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("calibration has no ", dtype, " attention rate for ",
                     group, " query heads per K/V head of ", config.head_dim,
                     " at ", threads, " threads; calibrate this model first"));
  }
  rates.kv_projection_flops_per_s = *kv;
  rates.layer_gemm_flops_per_s = *layer;
  rates.attention_flops_per_s = a->flops_per_s;
  if (const ModelPathRate* p = FindModelPath(
          calibration, config, dtype, threads, m, std::max<int64_t>(1, keys))) {
    const LayerCost layer = FitLayerCost(*p);
    rates.recompute_s_per_row = p->recompute_s_per_row;
    rates.layer_s_per_row = layer.per_row_s;
    rates.layer_s_per_attention_pair = layer.per_pair_s;
  }
  return rates;
}

const StorageRate* FindStorage(const Calibration& calibration,
                               absl::string_view directory) {
  for (const StorageRate& s : calibration.storage) {
    if (s.directory == directory) return &s;
  }
  return nullptr;
}

}  // namespace kvd::planner
