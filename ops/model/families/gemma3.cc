// The gemma3 family (Gemma 3 text models). Differences from llama: embeddings
// scaled by sqrt(d_model); RMSNorm on each head's queries and keys (QK-norm); a
// second norm after the attention and after the MLP (pre + post norms); GeGLU
// (tanh-approximated GELU) MLP; rotary embeddings on half-split pairs; five
// sliding-window layers (local RoPE base 10000) for every global layer (the
// file's RoPE base); attention scale 1/sqrt(head_dim) except the 27B model.
// GGUF converters fold Gemma's "(1 + w)" norm weights into w, so norms are
// plain RMSNorm here.
#include <cmath>

#include "base/status_macros.h"
#include "ops/model/architecture.h"

namespace kvd::ops {
namespace {

constexpr int64_t kGlobalLayerPeriod =
    6;  // layers 5, 11, 17, ... attend globally
constexpr float kLocalRopeBase = 10000.0f;

absl::StatusOr<ModelConfig> ReadGemma3Config(const GgufFile& f) {
  ModelConfig c;
  const std::string arch(f.architecture());
  KVD_RETURN_IF_ERROR(ReadCommonConfig(f, arch, &c));
  c.rope_style = kernels::cpu::RopeStyle::kHalfSplit;
  c.activation = Activation::kGeluTanh;
  c.qk_norm = true;
  c.post_attn_norm = true;
  c.post_ffn_norm = true;
  c.embedding_scale = std::sqrt(static_cast<float>(c.d_model));
  KVD_ASSIGN_OR_RETURN(float global_base, ArchRopeBase(f, arch, 1000000.0f));
  KVD_ASSIGN_OR_RETURN(int64_t window,
                       ArchIntOr(f, arch, "attention.sliding_window", 512));
  KVD_ASSIGN_OR_RETURN(float scaling,
                       ArchFloatOr(f, arch, "rope.scaling.factor", 1.0f));
  if (scaling != 1.0f) {
    return absl::UnimplementedError(
        f.path() +
        ": gemma3 RoPE scaling (rope.scaling.factor != 1) is not supported "
        "yet");
  }
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const bool global = (l + 1) % kGlobalLayerPeriod == 0;
    c.layers.push_back(global ? LayerConfig{0, global_base}
                              : LayerConfig{window, kLocalRopeBase});
  }
  return c;
}

}  // namespace

KVD_REGISTER_ARCHITECTURE(gemma3, {"gemma3"}, &ReadGemma3Config);

}  // namespace kvd::ops
