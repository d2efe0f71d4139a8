#include "ops/model/hf_loader.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/quant/dequant.h"
#include "kernels/quant/ggml_type.h"
#include "nlohmann/json.hpp"
#include "ops/model/model.h"

namespace kvd::ops {
namespace {

namespace fs = std::filesystem;

constexpr char kConfigFile[] = "config.json";
constexpr char kIndexFile[] = "model.safetensors.index.json";
constexpr int64_t kMaxIndexBytes = 64 << 20;

std::string JoinPath(const std::string& dir, const std::string& file) {
  return dir.empty() || dir.back() == '/' ? dir + file : dir + "/" + file;
}

std::string Basename(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::StatusOr<std::string> ReadSmallFile(const std::string& path,
                                          int64_t max_bytes) {
  std::error_code ec;
  const uintmax_t size = fs::file_size(path, ec);
  if (ec) {
    return absl::NotFoundError(
        absl::StrCat("cannot read '", path, "': ", ec.message()));
  }
  if (size > static_cast<uintmax_t>(max_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", path, "' is ", size, " bytes; at most ", max_bytes, " expected"));
  }
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in) return absl::DataLossError(absl::StrCat("cannot read '", path, "'"));
  return text.str();
}

// model.safetensors.index.json's weight_map: tensor name -> shard file name.
absl::StatusOr<std::map<std::string, std::string>> ReadIndex(
    const std::string& path) {
  KVD_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(path, kMaxIndexBytes));
  const auto bad = [&](absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors index '", path, "': ", what));
  };
  std::map<std::string, std::string> map;
  try {  // nothing from nlohmann may escape
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      return bad("not a JSON object");
    }
    const auto it = j.find("weight_map");
    if (it == j.end() || !it->is_object()) {
      return bad("has no \"weight_map\" object");
    }
    for (const auto& [tensor, shard] : it->items()) {
      if (!shard.is_string()) {
        return bad(absl::StrCat("weight_map entry '", tensor,
                                "' is not a file name string"));
      }
      const std::string& name = shard.get_ref<const std::string&>();
      // A shard is a file beside the index; never a path elsewhere.
      if (name.empty() || name == "." || name == ".." ||
          name.find('/') != std::string::npos) {
        return bad(absl::StrCat("weight_map entry '", tensor, "' names '", name,
                                "', which is not a file in the directory"));
      }
      map[tensor] = name;
    }
  } catch (const std::exception& e) {
    return bad(absl::StrCat("cannot be parsed: ", e.what()));
  }
  return map;
}

kernels::GgmlType GgmlTypeOf(SafetensorsDtype dtype) {
  switch (dtype) {
    case SafetensorsDtype::kF16:
      return kernels::GgmlType::kF16;
    case SafetensorsDtype::kBF16:
      return kernels::GgmlType::kBF16;
    default:
      return kernels::GgmlType::kF32;
  }
}

// Reads the tensors of one model, remembering which ones it used.
class WeightReader {
 public:
  WeightReader(const HfCheckpoint& ckpt, const ModelConfig& config,
               Precision precision, kernels::cpu::ThreadPool* pool)
      : ckpt_(ckpt), config_(config), precision_(precision), pool_(pool) {}

  absl::StatusOr<Matrix> Mat(const std::string& name, int64_t rows,
                             int64_t cols) {
    KVD_ASSIGN_OR_RETURN(const HfCheckpoint::Entry* e, Get(name, {rows, cols}));
    const kernels::GgmlType type = GgmlTypeOf(e->tensor->dtype);
    const uint64_t row_bytes = e->tensor->size_bytes / rows;
    const uint8_t* data = e->tensor->data;
    return Matrix::FromRows(
        rows, cols, precision_, pool_,
        [&](int64_t r, float* dst) -> absl::Status {
          absl::Status s = kernels::DequantizeRow(type, data + r * row_bytes,
                                                  row_bytes, dst, cols);
          if (!s.ok()) {
            return absl::InvalidArgumentError(absl::StrCat(
                "safetensors file '", e->file->name(), "': tensor '", name,
                "' row ", r, ": ", s.message()));
          }
          return absl::OkStatus();
        });
  }

  // `offset` is added to every value (Gemma's 1 + w norms).
  absl::StatusOr<std::vector<float>> Vec(const std::string& name, int64_t n,
                                         float offset = 0.0f) {
    KVD_ASSIGN_OR_RETURN(const HfCheckpoint::Entry* e, Get(name, {n}));
    std::vector<float> v(n);
    KVD_RETURN_IF_ERROR(e->file->ToFloat(*e->tensor, v.data(), n));
    if (offset != 0.0f) {
      for (float& x : v) x += offset;
    }
    return v;
  }

  bool Has(const std::string& name) const {
    return ckpt_.Find(name) != nullptr;
  }
  bool Used(const std::string& name) const { return used_.count(name) > 0; }

 private:
  absl::StatusOr<const HfCheckpoint::Entry*> Get(
      const std::string& name, const std::vector<int64_t>& shape) {
    const HfCheckpoint::Entry* e = ckpt_.Find(name);
    if (e == nullptr) {
      return absl::NotFoundError(
          absl::StrCat("checkpoint '", ckpt_.dir(), "': tensor '", name,
                       "' is missing (the ", config_.architecture,
                       " model that config.json describes needs it)"));
    }
    const SafetensorsFile::Tensor& t = *e->tensor;
    if (!SafetensorsDtypeToFloatSupported(t.dtype)) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors file '", e->file->name(), "': tensor '",
                       name, "' has dtype ", SafetensorsDtypeName(t.dtype),
                       "; kvd loads F32, F16 and BF16 checkpoints only"));
    }
    if (t.shape != shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          "safetensors file '", e->file->name(), "': tensor '", name,
          "' has shape ", ShapeString(t.shape), ", expected ",
          ShapeString(shape),
          " from config.json (the checkpoint and its config disagree)"));
    }
    used_.insert(name);
    return e;
  }

  const HfCheckpoint& ckpt_;
  const ModelConfig& config_;
  Precision precision_;
  kernels::cpu::ThreadPool* pool_;
  std::set<std::string> used_;
};

// Prefixes of the text model's tensors: text-only checkpoints, then the two
// layouts of Gemma3ForConditionalGeneration (before and after transformers
// 4.52).
constexpr const char* kPrefixes[] = {"model.", "language_model.model.",
                                     "model.language_model."};
constexpr const char* kLmHeads[] = {"lm_head.weight",
                                    "language_model.lm_head.weight"};

}  // namespace

absl::StatusOr<HfCheckpoint> HfCheckpoint::Open(const std::string& dir) {
  HfCheckpoint ckpt;
  ckpt.dir_ = dir;
  std::map<std::string, std::string> weight_map;
  std::vector<std::string> shards;
  const std::string index_path = JoinPath(dir, kIndexFile);
  std::error_code ec;
  if (fs::exists(index_path, ec)) {
    KVD_ASSIGN_OR_RETURN(weight_map, ReadIndex(index_path));
    std::set<std::string> names;
    for (const auto& [tensor, shard] : weight_map) names.insert(shard);
    shards.assign(names.begin(), names.end());
  } else {
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end;
         it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (absl::EndsWith(name, ".safetensors")) shards.push_back(name);
    }
    if (ec) {
      return absl::NotFoundError(absl::StrCat(
          "cannot list checkpoint directory '", dir, "': ", ec.message()));
    }
    std::sort(shards.begin(), shards.end());
  }
  if (shards.empty()) {
    return absl::NotFoundError(
        absl::StrCat("checkpoint directory '", dir,
                     "' has no *.safetensors weight files (kvd reads "
                     "safetensors checkpoints, not PyTorch .bin ones)"));
  }
  for (const std::string& shard : shards) {
    const std::string path = JoinPath(dir, shard);
    absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
    if (!file.ok()) {
      if (absl::IsNotFound(file.status()) && !weight_map.empty()) {
        std::string tensor;
        for (const auto& [t, s] : weight_map) {
          if (s == shard) {
            tensor = t;
            break;
          }
        }
        return absl::NotFoundError(absl::StrCat(
            "shard '", path, "' is listed in ", kIndexFile, " (for tensor '",
            tensor, "' and maybe others) but does not exist; the checkpoint ",
            "download is incomplete"));
      }
      return file.status();
    }
    auto owned = std::make_unique<SafetensorsFile>(*std::move(file));
    for (const SafetensorsFile::Tensor& t : owned->tensors()) {
      auto [it, inserted] =
          ckpt.tensors_.emplace(t.name, Entry{owned.get(), &t});
      if (!inserted) {
        return absl::InvalidArgumentError(absl::StrCat(
            "checkpoint '", dir, "': tensor '", t.name, "' is in both '",
            it->second.file->name(), "' and '", path, "'"));
      }
    }
    ckpt.files_.push_back(std::move(owned));
  }
  for (const auto& [tensor, shard] : weight_map) {
    const Entry* e = ckpt.Find(tensor);
    if (e == nullptr || e->file->name() != JoinPath(dir, shard)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint '", dir, "': ", kIndexFile, " places tensor '", tensor,
          "' in '", shard, "', but that file does not contain it"));
    }
  }
  return ckpt;
}

const HfCheckpoint::Entry* HfCheckpoint::Find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

std::vector<std::string> HfCheckpoint::TensorNames() const {
  std::vector<std::string> names;
  for (const auto& [name, entry] : tensors_) names.push_back(name);
  return names;
}

absl::StatusOr<ModelConfig> ModelConfigFromHf(const HfConfig& hf,
                                              const std::string& name,
                                              const std::string& source) {
  const auto unimplemented = [&](absl::string_view what) {
    return absl::UnimplementedError(
        absl::StrCat("config '", source, "': ", what));
  };
  const auto invalid = [&](absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat("config '", source, "': ", what));
  };
  ModelConfig c;
  if (hf.model_type == "llama" || hf.model_type == "qwen2") {
    c.architecture = hf.model_type;
  } else if (hf.model_type == "gemma3_text") {
    c.architecture = "gemma3";
  } else {
    return unimplemented(absl::StrCat(
        "model_type '", hf.model_type,
        "' is not supported; kvd loads Hugging Face checkpoints of llama, "
        "qwen2 and gemma3 (text) models"));
  }
  const bool gemma = c.architecture == "gemma3";
  c.name = name;
  c.n_layers = hf.num_hidden_layers;
  c.d_model = hf.hidden_size;
  c.n_heads = hf.num_attention_heads;
  c.n_kv_heads = hf.num_key_value_heads;
  c.head_dim = hf.head_dim;
  c.d_ff = hf.intermediate_size;
  c.vocab_size = hf.vocab_size;
  c.context_length = hf.max_position_embeddings;
  c.rope_dim = c.head_dim;
  c.rms_eps = static_cast<float>(hf.rms_norm_eps);
  // HF rotates half-split pairs (rotate_half) for every family; only GGUF
  // llama files are permuted for interleaved pairs.
  c.rope_style = kernels::cpu::RopeStyle::kHalfSplit;

  const std::string& act = hf.hidden_activation;
  if (gemma) {
    if (act != "gelu_pytorch_tanh") {
      return unimplemented(absl::StrCat("hidden_activation '", act,
                                        "' (kvd's gemma3 uses "
                                        "gelu_pytorch_tanh)"));
    }
    c.activation = Activation::kGeluTanh;
  } else {
    if (act != "silu" && act != "swish") {
      return unimplemented(absl::StrCat("hidden_act '", act, "' (kvd's ",
                                        c.architecture, " uses silu)"));
    }
    c.activation = Activation::kSilu;
  }
  // Qwen2 always has q/k/v biases; attention_bias elsewhere also adds one to
  // o_proj, which the forward pass does not have.
  c.qkv_bias = c.architecture == "qwen2";
  if (!c.qkv_bias && hf.attention_bias) {
    return unimplemented("attention_bias: true is not supported");
  }
  c.qk_norm = c.post_attn_norm = c.post_ffn_norm = gemma;
  if (gemma) c.embedding_scale = std::sqrt(static_cast<float>(c.d_model));
  // Left at the default when equal, so the scale is the GGUF path's bits.
  if (hf.query_pre_attn_scalar > 0 &&
      hf.query_pre_attn_scalar != static_cast<double>(c.head_dim)) {
    c.attention_scale =
        static_cast<float>(std::pow(hf.query_pre_attn_scalar, -0.5));
  }
  if (hf.final_logit_softcapping != 0 || hf.attn_logit_softcapping != 0) {
    return unimplemented("logit soft-capping is not supported");
  }
  if (hf.rope_scaling_type != "default" &&
      !(hf.rope_scaling_type == "linear" && hf.rope_scaling_factor == 1.0)) {
    return unimplemented(absl::StrCat("RoPE scaling '", hf.rope_scaling_type,
                                      "' (factor ", hf.rope_scaling_factor,
                                      ") is not supported yet"));
  }
  // Before anything is sized by the layer count.
  if (absl::Status v = c.ValidateSizes(); !v.ok()) return invalid(v.message());
  for (int64_t l = 0; l < c.n_layers; ++l) {
    LayerConfig lc;
    lc.rope_base = static_cast<float>(hf.rope_theta);
    if (hf.IsSlidingLayer(l)) {
      lc.sliding_window = hf.sliding_window;
      if (gemma) {
        if (hf.rope_local_base_freq <= 0) {
          return invalid("rope_local_base_freq must be positive");
        }
        lc.rope_base = static_cast<float>(hf.rope_local_base_freq);
      }
    }
    c.layers.push_back(lc);
  }
  if (absl::Status v = c.Validate(); !v.ok()) return invalid(v.message());
  return c;
}

absl::StatusOr<ModelWeights> LoadHfWeights(
    const HfCheckpoint& ckpt, const ModelConfig& c, bool tied,
    Precision precision, kernels::cpu::ThreadPool* pool,
    const std::function<void(int, int)>& progress) {
  std::string prefix;
  for (const char* p : kPrefixes) {
    if (ckpt.Find(absl::StrCat(p, "embed_tokens.weight")) != nullptr) {
      prefix = p;
      break;
    }
  }
  if (prefix.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "checkpoint '", ckpt.dir(),
        "': no token embeddings ('model.embed_tokens.weight', or under "
        "'language_model.model.' / 'model.language_model.')"));
  }
  const bool gemma = c.architecture == "gemma3";
  // Gemma's norms scale by (1 + w); kvd's RMSNorm by w.
  const float norm_offset = gemma ? 1.0f : 0.0f;
  WeightReader r(ckpt, c, precision, pool);
  ModelWeights w;
  const int total = static_cast<int>(c.n_layers) + 2;
  int done = 0;
  auto step = [&] {
    if (progress) progress(++done, total);
  };
  KVD_ASSIGN_OR_RETURN(w.token_embedding, r.Mat(prefix + "embed_tokens.weight",
                                                c.vocab_size, c.d_model));
  KVD_ASSIGN_OR_RETURN(w.output_norm,
                       r.Vec(prefix + "norm.weight", c.d_model, norm_offset));
  if (!tied) {
    std::string head = kLmHeads[0];
    if (!r.Has(head) && r.Has(kLmHeads[1])) head = kLmHeads[1];
    if (!r.Has(head)) {
      return absl::NotFoundError(absl::StrCat(
          "checkpoint '", ckpt.dir(),
          "': tensor 'lm_head.weight' is missing and config.json sets "
          "tie_word_embeddings to false"));
    }
    KVD_ASSIGN_OR_RETURN(w.output, r.Mat(head, c.vocab_size, c.d_model));
  }
  step();
  const int64_t d = c.d_model;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = absl::StrCat(prefix, "layers.", l, ".");
    const std::string a = p + "self_attn.";
    LayerWeights lw;
    KVD_ASSIGN_OR_RETURN(lw.attn_norm,
                         r.Vec(p + "input_layernorm.weight", d, norm_offset));
    KVD_ASSIGN_OR_RETURN(lw.wq, r.Mat(a + "q_proj.weight", c.q_dim(), d));
    KVD_ASSIGN_OR_RETURN(lw.wk, r.Mat(a + "k_proj.weight", c.kv_dim(), d));
    KVD_ASSIGN_OR_RETURN(lw.wv, r.Mat(a + "v_proj.weight", c.kv_dim(), d));
    KVD_ASSIGN_OR_RETURN(lw.wo, r.Mat(a + "o_proj.weight", d, c.q_dim()));
    if (c.qkv_bias) {
      KVD_ASSIGN_OR_RETURN(lw.bq, r.Vec(a + "q_proj.bias", c.q_dim()));
      KVD_ASSIGN_OR_RETURN(lw.bk, r.Vec(a + "k_proj.bias", c.kv_dim()));
      KVD_ASSIGN_OR_RETURN(lw.bv, r.Vec(a + "v_proj.bias", c.kv_dim()));
    }
    if (c.qk_norm) {
      KVD_ASSIGN_OR_RETURN(lw.q_norm,
                           r.Vec(a + "q_norm.weight", c.head_dim, norm_offset));
      KVD_ASSIGN_OR_RETURN(lw.k_norm,
                           r.Vec(a + "k_norm.weight", c.head_dim, norm_offset));
    }
    // "post_attention_layernorm" is the pre-MLP norm in llama and qwen2, but
    // the norm of the attention output in gemma3, whose pre-MLP norm is
    // "pre_feedforward_layernorm".
    if (gemma) {
      KVD_ASSIGN_OR_RETURN(
          lw.post_attn_norm,
          r.Vec(p + "post_attention_layernorm.weight", d, norm_offset));
      KVD_ASSIGN_OR_RETURN(
          lw.ffn_norm,
          r.Vec(p + "pre_feedforward_layernorm.weight", d, norm_offset));
      KVD_ASSIGN_OR_RETURN(
          lw.post_ffn_norm,
          r.Vec(p + "post_feedforward_layernorm.weight", d, norm_offset));
    } else {
      KVD_ASSIGN_OR_RETURN(lw.ffn_norm,
                           r.Vec(p + "post_attention_layernorm.weight", d));
    }
    KVD_ASSIGN_OR_RETURN(lw.w_gate,
                         r.Mat(p + "mlp.gate_proj.weight", c.d_ff, d));
    KVD_ASSIGN_OR_RETURN(lw.w_up, r.Mat(p + "mlp.up_proj.weight", c.d_ff, d));
    KVD_ASSIGN_OR_RETURN(lw.w_down,
                         r.Mat(p + "mlp.down_proj.weight", d, c.d_ff));
    w.layers.push_back(std::move(lw));
    step();
  }
  // A text-model tensor left over means a feature the forward pass lacks
  // (e.g. an o_proj or MLP bias): refuse rather than compute something else.
  for (const std::string& name : ckpt.TensorNames()) {
    const bool is_head = name == kLmHeads[0] || name == kLmHeads[1];
    if (r.Used(name) || (is_head && tied) ||
        absl::EndsWith(name, ".rotary_emb.inv_freq") ||
        (!is_head && !absl::StartsWith(name, prefix))) {
      continue;
    }
    return absl::UnimplementedError(absl::StrCat(
        "checkpoint '", ckpt.dir(), "': tensor '", name, "' has no place in ",
        "kvd's ", c.architecture,
        " model; the checkpoint uses a feature kvd does not support"));
  }
  step();
  return w;
}

absl::StatusOr<std::unique_ptr<Model>> Model::LoadHuggingFace(
    const std::string& dir, const LoadOptions& options) {
  namespace cpu = kernels::cpu;
  if (!cpu::IsaSupported(cpu::Isa::kAvx2)) {
    return absl::FailedPreconditionError(
        "kvd needs an x86-64 CPU with AVX2, FMA and F16C");
  }
  const std::string config_path = JoinPath(dir, kConfigFile);
  absl::StatusOr<HfConfig> hf = LoadHfConfig(config_path);
  if (absl::IsNotFound(hf.status())) {
    return absl::NotFoundError(absl::StrCat(
        "'", dir, "' is a directory without config.json; kvd loads a ",
        "directory as a Hugging Face checkpoint (config.json and ",
        "*.safetensors) and otherwise expects a .gguf file"));
  }
  if (!hf.ok()) return hf.status();
  std::unique_ptr<Model> m(new Model());
  KVD_ASSIGN_OR_RETURN(m->config_,
                       ModelConfigFromHf(*hf, Basename(dir), config_path));
  KVD_ASSIGN_OR_RETURN(HfCheckpoint ckpt, HfCheckpoint::Open(dir));
  m->precision_ = options.precision;
  m->pool_ = std::make_unique<cpu::ThreadPool>(options.num_threads);
  KVD_ASSIGN_OR_RETURN(
      m->weights_,
      LoadHfWeights(ckpt, m->config_, hf->tie_word_embeddings,
                    options.precision, m->pool_.get(), options.progress));
  return m;
}

}  // namespace kvd::ops
