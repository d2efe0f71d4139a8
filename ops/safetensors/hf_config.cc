#include "ops/safetensors/hf_config.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <exception>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"

namespace kvd::ops {
namespace {

constexpr int64_t kMaxLayers = 1024;  // as ModelConfig::Validate

using Json = nlohmann::json;

constexpr int64_t kMaxConfigBytes = 16 << 20;

// Defaults of transformers' config classes (LlamaConfig, Qwen2Config,
// Gemma3TextConfig) for keys a config.json may leave out. 0 / -1 mark
// "required" / "none".
struct FamilyDefaults {
  const char* model_type;
  bool structural_defaults;  // whether the sizes below may be defaulted at all
  int64_t vocab_size, hidden_size, intermediate_size, num_hidden_layers,
      num_attention_heads;
  int64_t num_key_value_heads;  // 0: num_attention_heads
  int64_t head_dim;             // 0: hidden_size / num_attention_heads
  int64_t max_position_embeddings;
  double rms_norm_eps, rope_theta, rope_local_base_freq;
  bool tie_word_embeddings;
  const char* hidden_activation;
  int32_t bos_token_id, eos_token_id;  // -1: none
  int64_t sliding_window;
  int64_t sliding_window_pattern;  // 0: the family has no pattern
  double query_pre_attn_scalar;
};

constexpr FamilyDefaults kFamilies[] = {
    {"llama", false,   0,   0,     0,      0, 0, 0, 0, 2048,
     1e-6,    10000.0, 0.0, false, "silu", 1, 2, 0, 0, 0},
    // Qwen2Config defaults num_key_value_heads to 32, not to the head count;
    // published Qwen2 configs always state it, and kvd uses the head count like
    // every other family.
    {"qwen2", false,   0,   0,     0,      0,  0,  0,    0, 32768,
     1e-6,    10000.0, 0.0, false, "silu", -1, -1, 4096, 0, 0},
    {"gemma3_text",
     true,
     262208,
     2304,
     9216,
     26,
     8,
     4,
     256,
     131072,
     1e-6,
     1000000.0,
     10000.0,
     true,
     "gelu_pytorch_tanh",
     2,
     1,
     4096,
     6,
     256},
};
constexpr FamilyDefaults kGeneric = {"", false, 0,  0,    0,       0,   0,
                                     0,  0,     0,  1e-6, 10000.0, 0.0, false,
                                     "", -1,    -1, 0,    0,       0};

const FamilyDefaults& DefaultsFor(absl::string_view model_type) {
  for (const FamilyDefaults& f : kFamilies) {
    if (model_type == f.model_type) return f;
  }
  return kGeneric;
}

// A JSON object and its dotted path in the file, for error messages.
struct Obj {
  const Json* json = nullptr;
  // "" for the top level, "text_config." for the nested text model.
  std::string path;
};

class Reader {
 public:
  explicit Reader(absl::string_view source) : source_(source) {}

  absl::Status Error(const Obj& obj, absl::string_view key,
                     absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(
        "config '", source_, "': key '", obj.path, key, "' ", what));
  }

  // The value of `key`, or nullptr if it is absent or null.
  static const Json* Find(const Obj& obj, absl::string_view key) {
    if (obj.json == nullptr) return nullptr;
    auto it = obj.json->find(std::string(key));
    if (it == obj.json->end() || it->is_null()) return nullptr;
    return &*it;
  }

  absl::StatusOr<std::optional<int64_t>> Int(const Obj& obj,
                                             absl::string_view key,
                                             int64_t min_value) const {
    const Json* v = Find(obj, key);
    if (v == nullptr) return std::optional<int64_t>();
    if (!v->is_number_integer() ||
        (v->is_number_unsigned() &&
         v->get<uint64_t>() >
             static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))) {
      return Error(obj, key,
                   absl::StrCat("must be an integer, got ", v->dump()));
    }
    const int64_t x = v->get<int64_t>();
    if (x < min_value) {
      return Error(obj, key,
                   absl::StrCat("must be at least ", min_value, ", got ", x));
    }
    return std::optional<int64_t>(x);
  }

  // Required unless `def` > 0 (the family has a default).
  absl::Status Size(const Obj& obj, absl::string_view key, int64_t def,
                    int64_t* out) const {
    absl::StatusOr<std::optional<int64_t>> v = Int(obj, key, 1);
    if (!v.ok()) return v.status();
    if (v->has_value()) {
      *out = **v;
    } else if (def > 0) {
      *out = def;
    } else {
      return Error(obj, key, "is required and missing");
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::optional<double>> Number(const Obj& obj,
                                               absl::string_view key) const {
    const Json* v = Find(obj, key);
    if (v == nullptr) return std::optional<double>();
    if (!v->is_number())
      return Error(obj, key, absl::StrCat("must be a number, got ", v->dump()));
    return std::optional<double>(v->get<double>());
  }

  absl::Status Double(const Obj& obj, absl::string_view key, double def,
                      double* out) const {
    absl::StatusOr<std::optional<double>> v = Number(obj, key);
    if (!v.ok()) return v.status();
    *out = v->value_or(def);
    return absl::OkStatus();
  }

  absl::StatusOr<std::optional<bool>> Bool(const Obj& obj,
                                           absl::string_view key) const {
    const Json* v = Find(obj, key);
    if (v == nullptr) return std::optional<bool>();
    if (!v->is_boolean()) {
      return Error(obj, key,
                   absl::StrCat("must be true or false, got ", v->dump()));
    }
    return std::optional<bool>(v->get<bool>());
  }

  absl::StatusOr<std::optional<std::string>> String(
      const Obj& obj, absl::string_view key) const {
    const Json* v = Find(obj, key);
    if (v == nullptr) return std::optional<std::string>();
    if (!v->is_string())
      return Error(obj, key, absl::StrCat("must be a string, got ", v->dump()));
    return std::optional<std::string>(v->get<std::string>());
  }

  // An int or a list of ints (eos_token_id may be either).
  absl::StatusOr<std::optional<std::vector<int32_t>>> TokenIds(
      const Obj& obj, absl::string_view key) const {
    const Json* v = Find(obj, key);
    if (v == nullptr) return std::optional<std::vector<int32_t>>();
    std::vector<int32_t> ids;
    const auto add = [&](const Json& id) {
      if (!id.is_number_unsigned() ||
          id.get<uint64_t>() >
              static_cast<uint64_t>(std::numeric_limits<int32_t>::max())) {
        return false;
      }
      ids.push_back(static_cast<int32_t>(id.get<uint64_t>()));
      return true;
    };
    bool ok = true;
    if (v->is_array()) {
      for (const Json& id : *v) ok = ok && add(id);
    } else {
      ok = add(*v);
    }
    if (!ok) {
      return Error(
          obj, key,
          absl::StrCat("must be a token id or a list of token ids, got ",
                       v->dump()));
    }
    return std::optional<std::vector<int32_t>>(std::move(ids));
  }

  absl::StatusOr<Obj> Object(const Obj& obj, absl::string_view key) const {
    const Json* v = Find(obj, key);
    if (v == nullptr) return Obj{nullptr, ""};
    if (!v->is_object())
      return Error(obj, key,
                   absl::StrCat("must be an object, got ", v->dump()));
    return Obj{v, absl::StrCat(obj.path, key, ".")};
  }

 private:
  absl::string_view source_;
};

// "torch_dtype", or "dtype" as transformers 5 writes it.
absl::StatusOr<std::optional<std::string>> Dtype(const Reader& r,
                                                 const Obj& obj) {
  std::optional<std::string> s;
  KVD_ASSIGN_OR_RETURN(s, r.String(obj, "torch_dtype"));
  if (!s.has_value()) {
    KVD_ASSIGN_OR_RETURN(s, r.String(obj, "dtype"));
  }
  return s;
}

absl::Status ReadRope(const Reader& r, const Obj& text,
                      const FamilyDefaults& fam, HfConfig* c) {
  std::optional<double> theta, local_theta;
  KVD_ASSIGN_OR_RETURN(theta, r.Number(text, "rope_theta"));
  KVD_ASSIGN_OR_RETURN(local_theta, r.Number(text, "rope_local_base_freq"));

  // Transformers 5 writes "rope_parameters"; older files "rope_scaling" (null
  // when unused).
  Obj params, local{nullptr, ""};
  KVD_ASSIGN_OR_RETURN(params, r.Object(text, "rope_parameters"));
  if (params.json != nullptr) {
    // Gemma 3: one RoPE per layer type.
    if (Reader::Find(params, "full_attention") != nullptr) {
      KVD_ASSIGN_OR_RETURN(local, r.Object(params, "sliding_attention"));
      KVD_ASSIGN_OR_RETURN(params, r.Object(params, "full_attention"));
    }
    std::optional<double> v;
    KVD_ASSIGN_OR_RETURN(v, r.Number(params, "rope_theta"));
    if (v.has_value()) theta = v;
    KVD_ASSIGN_OR_RETURN(v, r.Number(local, "rope_theta"));
    if (v.has_value()) local_theta = v;
  } else {
    KVD_ASSIGN_OR_RETURN(params, r.Object(text, "rope_scaling"));
  }
  c->rope_theta = theta.value_or(fam.rope_theta);
  c->rope_local_base_freq = local_theta.value_or(fam.rope_local_base_freq);
  if (c->rope_theta <= 0)
    return r.Error(text, "rope_theta", "must be positive");
  if (c->rope_local_base_freq < 0)
    return r.Error(text, "rope_local_base_freq", "must be >= 0");

  if (params.json == nullptr) return absl::OkStatus();
  std::optional<std::string> type;
  KVD_ASSIGN_OR_RETURN(type, r.String(params, "rope_type"));
  if (!type.has_value()) {  // the older spelling
    KVD_ASSIGN_OR_RETURN(type, r.String(params, "type"));
  }
  c->rope_scaling_type = type.value_or("default");
  KVD_RETURN_IF_ERROR(r.Double(params, "factor", 1.0, &c->rope_scaling_factor));
  KVD_RETURN_IF_ERROR(
      r.Double(params, "low_freq_factor", 0.0, &c->rope_low_freq_factor));
  KVD_RETURN_IF_ERROR(
      r.Double(params, "high_freq_factor", 0.0, &c->rope_high_freq_factor));
  std::optional<int64_t> original;
  KVD_ASSIGN_OR_RETURN(original,
                       r.Int(params, "original_max_position_embeddings", 1));
  c->rope_original_max_position_embeddings = original.value_or(0);
  if (c->rope_scaling_factor <= 0)
    return r.Error(params, "factor", "must be positive");
  return absl::OkStatus();
}

absl::Status ReadLayerTypes(const Reader& r, const Obj& text,
                            const FamilyDefaults& fam, HfConfig* c) {
  const int64_t n = c->num_hidden_layers;
  const Json* types = Reader::Find(text, "layer_types");
  if (types != nullptr) {
    if (!types->is_array() || static_cast<int64_t>(types->size()) != n) {
      return r.Error(
          text, "layer_types",
          absl::StrCat("must be a list of ", n, " strings (one per layer)"));
    }
    for (const Json& t : *types) {
      if (t == "full_attention") {
        c->layer_types.push_back(HfLayerType::kFullAttention);
      } else if (t == "sliding_attention") {
        c->layer_types.push_back(HfLayerType::kSlidingAttention);
      } else {
        return r.Error(text, "layer_types",
                       absl::StrCat("has ", t.dump(),
                                    "; supported are \"full_attention\" and "
                                    "\"sliding_attention\""));
      }
    }
    return absl::OkStatus();
  }
  c->layer_types.assign(n, c->sliding_window > 0
                               ? HfLayerType::kSlidingAttention
                               : HfLayerType::kFullAttention);
  if (fam.sliding_window_pattern > 0) {
    std::optional<int64_t> pattern;
    KVD_ASSIGN_OR_RETURN(pattern, r.Int(text, "sliding_window_pattern", 1));
    if (!pattern.has_value()) {
      KVD_ASSIGN_OR_RETURN(pattern, r.Int(text, "_sliding_window_pattern", 1));
    }
    const int64_t p = pattern.value_or(fam.sliding_window_pattern);
    for (int64_t i = 0; i < n; ++i) {
      c->layer_types[i] = (i + 1) % p != 0 ? HfLayerType::kSlidingAttention
                                           : HfLayerType::kFullAttention;
    }
  } else if (c->model_type == "qwen2" && c->sliding_window > 0) {
    std::optional<int64_t> max_window_layers;
    KVD_ASSIGN_OR_RETURN(max_window_layers,
                         r.Int(text, "max_window_layers", 0));
    for (int64_t i = 0; i < n; ++i) {
      c->layer_types[i] = i >= max_window_layers.value_or(28)
                              ? HfLayerType::kSlidingAttention
                              : HfLayerType::kFullAttention;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<HfConfig> ParseParsed(const Reader& r, const Json& root) {
  HfConfig c;
  const Obj top{&root, ""};

  const Json* archs = Reader::Find(top, "architectures");
  if (archs != nullptr) {
    if (!archs->is_array() || (!archs->empty() && !(*archs)[0].is_string())) {
      return r.Error(top, "architectures", "must be a list of strings");
    }
    if (!archs->empty()) c.architecture = (*archs)[0].get<std::string>();
  }
  std::optional<std::string> top_type;
  KVD_ASSIGN_OR_RETURN(top_type, r.String(top, "model_type"));
  if (!top_type.has_value())
    return r.Error(top, "model_type", "is required and missing");

  Obj text = top;
  Obj nested;
  KVD_ASSIGN_OR_RETURN(nested, r.Object(top, "text_config"));
  if (nested.json != nullptr) {
    text = nested;
    std::optional<std::string> text_type;
    KVD_ASSIGN_OR_RETURN(text_type, r.String(text, "model_type"));
    if (!text_type.has_value() && *top_type == "gemma3")
      text_type = "gemma3_text";
    if (!text_type.has_value())
      return r.Error(text, "model_type", "is required and missing");
    c.model_type = *text_type;
  } else {
    c.model_type = *top_type;
  }
  const FamilyDefaults& fam = DefaultsFor(c.model_type);
  const auto def = [&](int64_t v) { return fam.structural_defaults ? v : 0; };

  KVD_RETURN_IF_ERROR(
      r.Size(text, "hidden_size", def(fam.hidden_size), &c.hidden_size));
  KVD_RETURN_IF_ERROR(r.Size(text, "num_hidden_layers",
                             def(fam.num_hidden_layers), &c.num_hidden_layers));
  // Per-layer settings are sized by it below; the model's own checks
  // (ModelConfig::Validate) come later and use the same bound.
  if (c.num_hidden_layers > kMaxLayers) {
    return r.Error(text, "num_hidden_layers",
                   absl::StrCat("is ", c.num_hidden_layers,
                                "; kvd loads at most ", kMaxLayers, " layers"));
  }
  KVD_RETURN_IF_ERROR(r.Size(text, "num_attention_heads",
                             def(fam.num_attention_heads),
                             &c.num_attention_heads));
  KVD_RETURN_IF_ERROR(r.Size(text, "intermediate_size",
                             def(fam.intermediate_size), &c.intermediate_size));
  KVD_RETURN_IF_ERROR(
      r.Size(text, "vocab_size", def(fam.vocab_size), &c.vocab_size));
  KVD_RETURN_IF_ERROR(r.Size(text, "max_position_embeddings",
                             fam.max_position_embeddings,
                             &c.max_position_embeddings));
  KVD_RETURN_IF_ERROR(r.Size(text, "num_key_value_heads",
                             fam.num_key_value_heads > 0
                                 ? fam.num_key_value_heads
                                 : c.num_attention_heads,
                             &c.num_key_value_heads));
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return r.Error(text, "num_key_value_heads",
                   absl::StrCat("(", c.num_key_value_heads,
                                ") must divide num_attention_heads (",
                                c.num_attention_heads, ")"));
  }
  int64_t derived_head_dim = fam.head_dim;
  if (derived_head_dim == 0 && c.hidden_size % c.num_attention_heads == 0) {
    derived_head_dim = c.hidden_size / c.num_attention_heads;
  }
  if (derived_head_dim == 0 && Reader::Find(text, "head_dim") == nullptr) {
    return r.Error(text, "head_dim",
                   absl::StrCat("is missing and hidden_size (", c.hidden_size,
                                ") is not a multiple of num_attention_heads (",
                                c.num_attention_heads, ")"));
  }
  KVD_RETURN_IF_ERROR(r.Size(text, "head_dim", derived_head_dim, &c.head_dim));

  KVD_RETURN_IF_ERROR(
      r.Double(text, "rms_norm_eps", fam.rms_norm_eps, &c.rms_norm_eps));
  if (!(c.rms_norm_eps > 0))
    return r.Error(text, "rms_norm_eps", "must be positive");
  KVD_RETURN_IF_ERROR(ReadRope(r, text, fam, &c));

  std::optional<int64_t> window;
  KVD_ASSIGN_OR_RETURN(window, r.Int(text, "sliding_window", 0));
  c.sliding_window = window.value_or(fam.sliding_window);
  std::optional<bool> use_window;
  KVD_ASSIGN_OR_RETURN(use_window, r.Bool(text, "use_sliding_window"));
  if (!use_window.value_or(c.model_type != "qwen2")) c.sliding_window = 0;
  KVD_RETURN_IF_ERROR(ReadLayerTypes(r, text, fam, &c));

  std::optional<bool> flag;
  KVD_ASSIGN_OR_RETURN(flag, r.Bool(text, "attention_bias"));
  c.attention_bias = flag.value_or(false);
  KVD_RETURN_IF_ERROR(r.Double(text, "query_pre_attn_scalar",
                               fam.query_pre_attn_scalar,
                               &c.query_pre_attn_scalar));
  KVD_RETURN_IF_ERROR(r.Double(text, "final_logit_softcapping", 0.0,
                               &c.final_logit_softcapping));
  KVD_RETURN_IF_ERROR(
      r.Double(text, "attn_logit_softcapping", 0.0, &c.attn_logit_softcapping));

  std::optional<std::string> s;
  KVD_ASSIGN_OR_RETURN(s, r.String(text, "hidden_activation"));
  if (!s.has_value()) {
    KVD_ASSIGN_OR_RETURN(s, r.String(text, "hidden_act"));
  }
  c.hidden_activation = s.value_or(fam.hidden_activation);

  // Model-level keys: a multimodal config's top level describes the model one
  // runs (gemma-3-4b-it lists eos [1, 106] there and nothing in text_config),
  // so it wins over the text config.
  const bool is_nested = text.json != top.json;
  const Obj& first = is_nested ? top : text;
  KVD_ASSIGN_OR_RETURN(flag, r.Bool(first, "tie_word_embeddings"));
  if (!flag.has_value() && is_nested) {
    KVD_ASSIGN_OR_RETURN(flag, r.Bool(text, "tie_word_embeddings"));
  }
  c.tie_word_embeddings = flag.value_or(fam.tie_word_embeddings);

  KVD_ASSIGN_OR_RETURN(s, Dtype(r, first));
  if (!s.has_value() && is_nested) {
    KVD_ASSIGN_OR_RETURN(s, Dtype(r, text));
  }
  c.torch_dtype = s.value_or("");

  const auto token_ids = [&](const char* key, int32_t family_default,
                             std::vector<int32_t>* out) -> absl::Status {
    std::optional<std::vector<int32_t>> ids;
    KVD_ASSIGN_OR_RETURN(ids, r.TokenIds(first, key));
    if (!ids.has_value() && is_nested) {
      KVD_ASSIGN_OR_RETURN(ids, r.TokenIds(text, key));
    }
    if (ids.has_value()) {
      *out = *std::move(ids);
    } else if (family_default >= 0) {
      *out = {family_default};
    }
    return absl::OkStatus();
  };
  KVD_RETURN_IF_ERROR(
      token_ids("bos_token_id", fam.bos_token_id, &c.bos_token_ids));
  KVD_RETURN_IF_ERROR(
      token_ids("eos_token_id", fam.eos_token_id, &c.eos_token_ids));
  return c;
}

}  // namespace

absl::StatusOr<HfConfig> ParseHfConfig(absl::string_view json_text,
                                       absl::string_view source) {
  const Reader reader(source);
  try {
    const Json root = Json::parse(json_text.begin(), json_text.end(), nullptr,
                                  /*allow_exceptions=*/false);
    if (root.is_discarded()) {
      return absl::InvalidArgumentError(
          absl::StrCat("config '", source, "' is not valid JSON"));
    }
    if (!root.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat("config '", source, "' is a JSON ", root.type_name(),
                       ", not an object"));
    }
    return ParseParsed(reader, root);
  } catch (const std::exception&
               e) {  // nothing from nlohmann may escape this boundary
    return absl::InvalidArgumentError(
        absl::StrCat("config '", source, "' cannot be parsed: ", e.what()));
  }
}

absl::StatusOr<HfConfig> LoadHfConfig(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return absl::ErrnoToStatus(errno,
                               absl::StrCat("cannot open config '", path, "'"));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
      st.st_size > kMaxConfigBytes) {
    close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat("config '", path, "' is not a regular file of at most ",
                     kMaxConfigBytes, " bytes"));
  }
  std::string text(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t got = read(fd, text.data() + done, text.size() - done);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      const int e = got < 0 ? errno : EIO;
      close(fd);
      return absl::ErrnoToStatus(
          e, absl::StrCat("cannot read config '", path, "'"));
    }
    done += static_cast<size_t>(got);
  }
  close(fd);
  return ParseHfConfig(text, path);
}

}  // namespace kvd::ops
