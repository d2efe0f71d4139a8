// The llama family: Llama 2/3, SmolLM2, TinyLlama, Mistral (dense). Pre-norm
// RMSNorm blocks, SwiGLU MLP, rotary embeddings on interleaved pairs (GGUF
// stores Q/K permuted for GGML's "normal" RoPE), grouped-query attention, tied
// or untied output embeddings.
#include "base/status_macros.h"
#include "ops/model/architecture.h"

namespace kvd::ops {
namespace {

absl::StatusOr<ModelConfig> ReadLlamaConfig(const GgufFile& f) {
  ModelConfig c;
  const std::string arch(f.architecture());
  KVD_RETURN_IF_ERROR(ReadCommonConfig(f, arch, &c));
  c.rope_style = kernels::cpu::RopeStyle::kInterleaved;
  c.activation = Activation::kSilu;
  KVD_ASSIGN_OR_RETURN(float base, ArchRopeBase(f, arch, 10000.0f));
  KVD_ASSIGN_OR_RETURN(int64_t window,
                       ArchIntOr(f, arch, "attention.sliding_window", 0));
  c.layers.assign(c.n_layers, LayerConfig{window, base});
  return c;
}

}  // namespace

KVD_REGISTER_ARCHITECTURE(llama, {"llama", "mistral"}, &ReadLlamaConfig);

}  // namespace kvd::ops
