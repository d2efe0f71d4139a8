// The qwen2 family: llama-like blocks with biases on the Q/K/V projections and
// rotary embeddings on half-split pairs (GGML's "neox" style).
#include "base/status_macros.h"
#include "ops/model/architecture.h"

namespace kvd::ops {
namespace {

absl::StatusOr<ModelConfig> ReadQwen2Config(const GgufFile& f) {
  ModelConfig c;
  const std::string arch(f.architecture());
  KVD_RETURN_IF_ERROR(ReadCommonConfig(f, arch, &c));
  c.rope_style = kernels::cpu::RopeStyle::kHalfSplit;
  c.activation = Activation::kSilu;
  c.qkv_bias = true;
  KVD_ASSIGN_OR_RETURN(float base, ArchRopeBase(f, arch, 1000000.0f));
  c.layers.assign(c.n_layers, LayerConfig{0, base});
  return c;
}

}  // namespace

KVD_REGISTER_ARCHITECTURE(qwen2, {"qwen2"}, &ReadQwen2Config);

}  // namespace kvd::ops
