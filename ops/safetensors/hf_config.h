// Hugging Face `config.json` reader: the architecture settings kvd needs, as a
// plain struct.
//
// Reads the llama, qwen2 and gemma3 families (and any config with the same
// keys). For a multimodal Gemma 3 config (model_type "gemma3") the text model's
// settings are read from its "text_config" object, except the model-level keys
// (token ids, tie_word_embeddings, dtype), which are taken from the top level
// first (it describes the model one runs) and from the text_config only when
// the top level lacks them. A key that is absent or JSON null takes the default
// of transformers' config class for the family (LlamaConfig, Qwen2Config,
// Gemma3TextConfig); the structural sizes (hidden_size, num_hidden_layers,
// num_attention_heads, intermediate_size, vocab_size) are required except for
// gemma3_text, whose published multimodal configs leave them to
// Gemma3TextConfig's defaults. Both the classic keys (rope_theta, rope_scaling,
// rope_local_base_freq) and transformers 5's "rope_parameters" are understood.
//
// Errors are INVALID_ARGUMENT naming the file and the key
// ("text_config.hidden_size") and what is wrong with it; a missing file is
// NOT_FOUND.
//
// Thread-safety: pure functions; HfConfig is a value type.
//
//   KVD_ASSIGN_OR_RETURN(HfConfig config, LoadHfConfig(dir + "/config.json"));
//   bool local = config.IsSlidingLayer(layer);
#ifndef KVD_OPS_SAFETENSORS_HF_CONFIG_H_
#define KVD_OPS_SAFETENSORS_HF_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvd::ops {

enum class HfLayerType { kFullAttention, kSlidingAttention };

struct HfConfig {
  // architectures[0] ("LlamaForCausalLM"); empty if not listed.
  std::string architecture;
  // Of the text model: "llama", "qwen2", "gemma3_text", ...
  std::string model_type;

  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // default: num_attention_heads
  int64_t head_dim = 0;             // default: hidden_size / heads
  int64_t intermediate_size = 0;
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 0;

  // RoPE base of full-attention layers, and of sliding-window layers where the
  // family has a separate one (Gemma 3's rope_local_base_freq; 0 otherwise).
  double rope_theta = 0;
  double rope_local_base_freq = 0;
  // rope_scaling of the full-attention layers: "default" (none), "linear",
  // "llama3", ... The llama3/yarn fields are 0 when absent.
  std::string rope_scaling_type = "default";
  double rope_scaling_factor = 1.0;
  double rope_low_freq_factor = 0;
  double rope_high_freq_factor = 0;
  int64_t rope_original_max_position_embeddings = 0;

  // Attention window of sliding layers in tokens; 0 = no sliding window.
  // Qwen2's `use_sliding_window: false` turns its sliding_window off, as
  // transformers does.
  int64_t sliding_window = 0;
  // One entry per layer: from "layer_types", else Gemma 3's
  // sliding_window_pattern (every pattern-th layer is global), else Qwen2's
  // max_window_layers rule, else all sliding when sliding_window > 0
  // (Mistral-style), else all full.
  std::vector<HfLayerType> layer_types;

  bool tie_word_embeddings = false;
  // Qwen2's q/k/v biases are implied by the family, not by this key.
  bool attention_bias = false;
  // Gemma: attention scores scale by its -1/2 power; 0 = not given.
  double query_pre_attn_scalar = 0;
  double final_logit_softcapping = 0;  // 0 = off
  double attn_logit_softcapping = 0;   // 0 = off
  // An int or a list in the file; empty if none.
  std::vector<int32_t> bos_token_ids;
  std::vector<int32_t> eos_token_ids;
  // "silu", "gelu_pytorch_tanh", ... (from hidden_activation or hidden_act).
  std::string hidden_activation;
  // "bfloat16", ... (from torch_dtype or dtype); empty if absent.
  std::string torch_dtype;

  bool IsSlidingLayer(int64_t layer) const {
    return layer >= 0 && layer < static_cast<int64_t>(layer_types.size()) &&
           layer_types[layer] == HfLayerType::kSlidingAttention;
  }
};

// Parses config.json text. `source` names the file in error messages.
absl::StatusOr<HfConfig> ParseHfConfig(absl::string_view json_text,
                                       absl::string_view source);

// Reads and parses the config.json at `path` (at most 16 MiB).
absl::StatusOr<HfConfig> LoadHfConfig(const std::string& path);

}  // namespace kvd::ops

#endif  // KVD_OPS_SAFETENSORS_HF_CONFIG_H_
