// Architecture-independent description of a decoder-only transformer.
//
// A model family (ops/model/families/*.cc) reads its file's metadata into this
// struct; the one generic forward pass (model.cc) is driven entirely by it, so
// adding a family never touches the forward pass (docs/HOWTO-add-model.md).
#ifndef KVD_OPS_MODEL_MODEL_CONFIG_H_
#define KVD_OPS_MODEL_MODEL_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/cpu/elementwise.h"

namespace kvd::ops {

enum class Activation { kSilu, kGeluTanh };

// Numeric precision of weights, K/V and the residual stream at layer boundaries
// (DESIGN.md section 3). Accumulation is always fp32.
enum class Precision { kF32, kBf16 };
const char* PrecisionName(Precision p);
// The inverse of PrecisionName: "fp32" or "bf16", else INVALID_ARGUMENT.
absl::StatusOr<Precision> ParsePrecision(absl::string_view name);

struct LayerConfig {
  int64_t sliding_window =
      0;  // 0: global attention; else keys within this many positions
  float rope_base = 10000.0f;
};

struct ModelConfig {
  std::string architecture;
  std::string name;
  int64_t n_layers = 0;
  int64_t d_model = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t d_ff = 0;
  int64_t vocab_size = 0;
  int64_t context_length = 0;
  float rms_eps = 1e-5f;
  kernels::cpu::RopeStyle rope_style = kernels::cpu::RopeStyle::kInterleaved;
  int64_t rope_dim = 0;
  bool qkv_bias = false;
  bool qk_norm = false;
  bool post_attn_norm = false;
  bool post_ffn_norm = false;
  Activation activation = Activation::kSilu;
  float embedding_scale = 1.0f;  // gemma: sqrt(d_model)
  float attention_scale = 0.0f;  // 0: 1 / sqrt(head_dim)
  std::vector<LayerConfig> layers;

  int64_t q_dim() const { return n_heads * head_dim; }
  int64_t kv_dim() const { return n_kv_heads * head_dim; }
  // G of the numerics contract's row-parallel projections (W_o, W_down;
  // kernels/cpu/row_parallel_gemm.h): their inputs are summed as G ordered
  // partials, so every tensor-parallel degree dividing G gives the same bits.
  // The K/V heads (the unit a shard holds), or their greatest common divisor
  // with d_ff where the MLP does not split as finely.
  int64_t row_parallel_groups() const;
  float attn_scale() const;
  // OK if the sizes are ones the forward pass can run: every size positive
  // and plausible (so a corrupt file cannot make kvd allocate terabytes),
  // heads divisible into K/V groups, even head and RoPE sizes, a finite
  // non-negative RMSNorm epsilon. Loaders call it as soon as the sizes are
  // read, before allocating anything sized by them (such as `layers`).
  absl::Status ValidateSizes() const;
  // ValidateSizes, plus one LayerConfig per layer, each with a finite
  // positive RoPE base and a non-negative window. Every loader calls it; the
  // message does not name the file.
  absl::Status Validate() const;
  // Parameter count of the transformer (embeddings counted once).
  int64_t ParameterCount(bool tied_output) const;
};

}  // namespace kvd::ops

#endif  // KVD_OPS_MODEL_MODEL_CONFIG_H_
