#include "ops/model/testing/hf_tiny_model.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "kernels/quant/half.h"
#include "nlohmann/json.hpp"
#include "ops/gguf/gguf_writer.h"

namespace kvd::ops::testing {
namespace {

using Json = nlohmann::json;

float RoundTo(const std::string& dtype, float x) {
  if (dtype == "F16") return kernels::Fp16ToFp32(kernels::Fp32ToFp16(x));
  if (dtype == "BF16") return kernels::Bf16ToFp32(kernels::Fp32ToBf16(x));
  if (dtype == "I32") return std::nearbyint(x);
  return x;
}

class Filler {
 public:
  explicit Filler(uint32_t seed) : rng_(seed) {}
  std::vector<float> Random(int64_t n, float center, float spread) {
    std::normal_distribution<float> d(0.0f, spread);
    std::vector<float> v(n);
    for (float& x : v) x = center + d(rng_);
    return v;
  }

 private:
  std::mt19937 rng_;
};

std::string Prefix(const HfTinySpec& s) {
  return s.multimodal ? "language_model.model." : "model.";
}

std::string LmHead(const HfTinySpec& s) {
  return s.multimodal ? "language_model.lm_head.weight" : "lm_head.weight";
}

absl::Status WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), bytes.size());
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

// Rows i and i + d/2 of each head become rows 2i and 2i + 1: llama.cpp's
// LlamaModel.permute (reshape(heads, 2, d/2, cols).swapaxes(1, 2)).
std::vector<float> PermuteForInterleavedRope(const std::vector<float>& w,
                                             int64_t heads, int64_t cols) {
  const int64_t rows = static_cast<int64_t>(w.size()) / cols;
  const int64_t d = rows / heads, half = d / 2;
  std::vector<float> out(w.size());
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < half; ++i) {
      for (int64_t j = 0; j < 2; ++j) {
        const int64_t src = h * d + j * half + i, dst = h * d + 2 * i + j;
        std::copy_n(w.begin() + src * cols, cols, out.begin() + dst * cols);
      }
    }
  }
  return out;
}

}  // namespace

std::vector<HfTensor> MakeHfTinyTensors(const HfTinySpec& s) {
  Filler f(s.seed);
  std::vector<HfTensor> out;
  const bool gemma = s.family == "gemma3";
  auto add = [&](const std::string& name, std::vector<int64_t> shape,
                 float center, float spread) {
    int64_t n = 1;
    for (int64_t x : shape) n *= x;
    const std::string& dtype =
        shape.size() == 2 ? s.matrix_dtype : s.vector_dtype;
    std::vector<float> v = f.Random(n, center, spread);
    for (float& x : v) x = RoundTo(dtype, x);
    out.push_back(HfTensor{name, std::move(shape), dtype, std::move(v)});
  };
  // Gemma norms are stored as the offset from 1.
  const float norm_center = gemma ? 0.0f : 1.0f;
  const int64_t d = s.d_model, qd = s.n_heads * s.head_dim,
                kvd = s.n_kv_heads * s.head_dim;
  const float proj = 1.0f / std::sqrt(static_cast<float>(d));
  const std::string p = Prefix(s);
  add(p + "embed_tokens.weight", {s.vocab_size, d}, 0.0f, 1.0f);
  add(p + "norm.weight", {d}, norm_center, 0.1f);
  if (!s.tied_embeddings) add(LmHead(s), {s.vocab_size, d}, 0.0f, proj);
  for (int64_t l = 0; l < s.n_layers; ++l) {
    const std::string lp = absl::StrCat(p, "layers.", l, ".");
    add(lp + "input_layernorm.weight", {d}, norm_center, 0.1f);
    add(lp + "self_attn.q_proj.weight", {qd, d}, 0.0f, proj);
    add(lp + "self_attn.k_proj.weight", {kvd, d}, 0.0f, proj);
    add(lp + "self_attn.v_proj.weight", {kvd, d}, 0.0f, proj);
    add(lp + "self_attn.o_proj.weight", {d, qd}, 0.0f, proj);
    if (s.family == "qwen2") {
      add(lp + "self_attn.q_proj.bias", {qd}, 0.0f, 0.1f);
      add(lp + "self_attn.k_proj.bias", {kvd}, 0.0f, 0.1f);
      add(lp + "self_attn.v_proj.bias", {kvd}, 0.0f, 0.1f);
    }
    if (gemma) {
      add(lp + "self_attn.q_norm.weight", {s.head_dim}, norm_center, 0.1f);
      add(lp + "self_attn.k_norm.weight", {s.head_dim}, norm_center, 0.1f);
      add(lp + "pre_feedforward_layernorm.weight", {d}, norm_center, 0.1f);
      add(lp + "post_feedforward_layernorm.weight", {d}, norm_center, 0.1f);
    }
    add(lp + "post_attention_layernorm.weight", {d}, norm_center, 0.1f);
    add(lp + "mlp.gate_proj.weight", {s.d_ff, d}, 0.0f, proj);
    add(lp + "mlp.up_proj.weight", {s.d_ff, d}, 0.0f, proj);
    add(lp + "mlp.down_proj.weight", {d, s.d_ff}, 0.0f,
        1.0f / std::sqrt(static_cast<float>(s.d_ff)));
  }
  if (s.multimodal) {  // ignored by a text-only loader
    add("vision_tower.vision_model.embeddings.patch_embedding.weight", {8, 4},
        0.0f, 1.0f);
    add("multi_modal_projector.mm_soft_emb_norm.weight", {4}, 0.0f, 0.1f);
  }
  return out;
}

std::string HfTinyConfigJson(const HfTinySpec& s) {
  const bool gemma = s.family == "gemma3";
  Json text = {
      {"model_type", gemma ? "gemma3_text" : s.family},
      {"hidden_size", s.d_model},
      {"intermediate_size", s.d_ff},
      {"num_hidden_layers", s.n_layers},
      {"num_attention_heads", s.n_heads},
      {"num_key_value_heads", s.n_kv_heads},
      {"head_dim", s.head_dim},
      {"vocab_size", s.vocab_size},
      {"max_position_embeddings", s.context_length},
      {"rms_norm_eps", gemma ? 1e-6 : 1e-5},
      {"rope_theta", gemma ? 1000000.0 : 10000.0},
  };
  if (gemma) {
    text["hidden_activation"] = "gelu_pytorch_tanh";
    text["rope_local_base_freq"] = 10000.0;
    text["sliding_window"] = s.sliding_window;
    text["query_pre_attn_scalar"] = s.head_dim;
    text["rope_scaling"] = nullptr;
    text["final_logit_softcapping"] = nullptr;
    text["attn_logit_softcapping"] = nullptr;
    if (s.multimodal) {
      Json types = Json::array();
      for (int64_t l = 0; l < s.n_layers; ++l)
        types.push_back((l + 1) % 6 == 0 ? "full_attention"
                                         : "sliding_attention");
      text["layer_types"] = types;
    } else {
      text["sliding_window_pattern"] = 6;
    }
  } else {
    text["hidden_act"] = "silu";
  }
  if (s.family == "qwen2") {
    text["use_sliding_window"] = false;
    text["sliding_window"] = 4096;
  }
  Json top;
  if (gemma && s.multimodal) {
    top = {{"architectures", {"Gemma3ForConditionalGeneration"}},
           {"model_type", "gemma3"},
           {"text_config", text},
           {"vision_config", {{"model_type", "siglip_vision_model"}}}};
  } else {
    top = text;
    const char* arch = s.family == "llama"   ? "LlamaForCausalLM"
                       : s.family == "qwen2" ? "Qwen2ForCausalLM"
                                             : "Gemma3ForCausalLM";
    top["architectures"] = {arch};
  }
  top["tie_word_embeddings"] = s.tied_embeddings;
  top["torch_dtype"] = "float32";
  return top.dump(2);
}

std::string SafetensorsBytes(const std::vector<const HfTensor*>& tensors) {
  Json header = Json::object();
  std::string data;
  for (const HfTensor* t : tensors) {
    const size_t begin = data.size();
    for (float x : t->values) {
      if (t->dtype == "F32") {
        data.append(reinterpret_cast<const char*>(&x), 4);
      } else if (t->dtype == "I32") {
        const int32_t i = static_cast<int32_t>(x);
        data.append(reinterpret_cast<const char*>(&i), 4);
      } else {
        const uint16_t h =
            t->dtype == "F16" ? kernels::Fp32ToFp16(x) : kernels::Fp32ToBf16(x);
        data.append(reinterpret_cast<const char*>(&h), 2);
      }
    }
    header[t->name] = {{"dtype", t->dtype},
                       {"shape", t->shape},
                       {"data_offsets", {begin, data.size()}}};
  }
  std::string h = header.dump();
  while (h.size() % 8 != 0) h.push_back(' ');  // as the official writer pads
  std::string out(8, '\0');
  const uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + h + data;
}

absl::Status WriteHfCheckpoint(const HfTinySpec& s,
                               const std::vector<HfTensor>& tensors,
                               const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("mkdir ", dir));
  KVD_RETURN_IF_ERROR(WriteFile(dir + "/config.json", HfTinyConfigJson(s)));
  if (s.shards <= 1) {
    std::vector<const HfTensor*> all;
    for (const HfTensor& t : tensors) all.push_back(&t);
    return WriteFile(dir + "/model.safetensors", SafetensorsBytes(all));
  }
  std::vector<std::vector<const HfTensor*>> parts(s.shards);
  Json weight_map = Json::object();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const size_t shard = i * s.shards / tensors.size();
    parts[shard].push_back(&tensors[i]);
    weight_map[tensors[i].name] =
        absl::StrFormat("model-%05d-of-%05d.safetensors", shard + 1, s.shards);
  }
  for (int i = 0; i < s.shards; ++i) {
    KVD_RETURN_IF_ERROR(
        WriteFile(absl::StrFormat("%s/model-%05d-of-%05d.safetensors", dir,
                                  i + 1, s.shards),
                  SafetensorsBytes(parts[i])));
  }
  const Json index = {{"metadata", {{"total_size", 0}}},
                      {"weight_map", weight_map}};
  return WriteFile(dir + "/model.safetensors.index.json", index.dump(2));
}

absl::Status WriteGgufEquivalent(const HfTinySpec& s,
                                 const std::vector<HfTensor>& tensors,
                                 const std::string& path) {
  const bool gemma = s.family == "gemma3";
  GgufWriter w;
  const std::string& a = s.family;
  w.AddString("general.architecture", a);
  w.AddString("general.name", "tiny-" + a);
  w.AddUint32(a + ".block_count", s.n_layers);
  w.AddUint32(a + ".embedding_length", s.d_model);
  w.AddUint32(a + ".feed_forward_length", s.d_ff);
  w.AddUint32(a + ".attention.head_count", s.n_heads);
  w.AddUint32(a + ".attention.head_count_kv", s.n_kv_heads);
  w.AddUint32(a + ".context_length", s.context_length);
  w.AddFloat32(a + ".attention.layer_norm_rms_epsilon", gemma ? 1e-6f : 1e-5f);
  w.AddFloat32(a + ".rope.freq_base", gemma ? 1000000.0f : 10000.0f);
  w.AddUint32(a + ".attention.key_length", s.head_dim);
  w.AddUint32(a + ".attention.value_length", s.head_dim);
  if (gemma) w.AddUint32(a + ".attention.sliding_window", s.sliding_window);
  std::vector<std::string> tokens;
  for (int64_t i = 0; i < s.vocab_size; ++i)
    tokens.push_back(absl::StrCat("<t", i, ">"));
  w.AddString("tokenizer.ggml.model", "gpt2");
  w.AddStringArray("tokenizer.ggml.tokens",
                   absl::Span<const std::string>(tokens));

  // HF suffix -> GGUF suffix; "*" marks a norm (gemma3 stores w + 1).
  const std::map<std::string, std::string> layer_names = {
      {"input_layernorm.weight", "*attn_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"self_attn.q_proj.bias", "attn_q.bias"},
      {"self_attn.k_proj.bias", "attn_k.bias"},
      {"self_attn.v_proj.bias", "attn_v.bias"},
      {"self_attn.q_norm.weight", "*attn_q_norm.weight"},
      {"self_attn.k_norm.weight", "*attn_k_norm.weight"},
      {"post_attention_layernorm.weight",
       gemma ? "*post_attention_norm.weight" : "*ffn_norm.weight"},
      {"pre_feedforward_layernorm.weight", "*ffn_norm.weight"},
      {"post_feedforward_layernorm.weight", "*post_ffw_norm.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"},
  };
  const std::string p = Prefix(s);
  for (const HfTensor& t : tensors) {
    std::string name;
    bool norm = false;
    if (t.name == p + "embed_tokens.weight") {
      name = "token_embd.weight";
    } else if (t.name == p + "norm.weight") {
      name = "output_norm.weight";
      norm = true;
    } else if (t.name == LmHead(s)) {
      name = "output.weight";
    } else if (absl::StartsWith(t.name, p + "layers.")) {
      const std::string rest = t.name.substr(p.size() + 7);
      const size_t dot = rest.find('.');
      auto it = layer_names.find(rest.substr(dot + 1));
      if (it == layer_names.end())
        return absl::InternalError("unmapped " + t.name);
      norm = it->second[0] == '*';
      name = absl::StrCat("blk.", rest.substr(0, dot), ".",
                          it->second.substr(norm ? 1 : 0));
    } else {
      continue;  // vision tower
    }
    std::vector<float> v = t.values;
    if (norm && gemma) {
      for (float& x : v) x += 1.0f;
    }
    if (a == "llama" && absl::EndsWith(name, "attn_q.weight"))
      v = PermuteForInterleavedRope(v, s.n_heads, s.d_model);
    if (a == "llama" && absl::EndsWith(name, "attn_k.weight"))
      v = PermuteForInterleavedRope(v, s.n_kv_heads, s.d_model);
    std::vector<int64_t> dims(t.shape.rbegin(), t.shape.rend());
    w.AddTensorF32(name, dims, v);
  }
  return w.WriteToFile(path);
}

}  // namespace kvd::ops::testing
