#include "ops/model/architecture.h"

#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"

namespace kvd::ops {
namespace {

std::map<std::string, ArchitectureEntry>& Registry() {
  static auto* registry = new std::map<std::string, ArchitectureEntry>();
  return *registry;
}

}  // namespace

bool RegisterArchitecture(ArchitectureEntry entry) {
  for (const std::string& name : entry.names) Registry()[name] = entry;
  return true;
}

absl::StatusOr<const ArchitectureEntry*> FindArchitecture(
    const std::string& name) {
  auto it = Registry().find(name);
  if (it == Registry().end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unsupported model architecture '", name,
        "'; kvd supports: ", absl::StrJoin(SupportedArchitectures(), ", ")));
  }
  return &it->second;
}

std::vector<std::string> SupportedArchitectures() {
  std::vector<std::string> out;
  for (const auto& [name, entry] : Registry()) out.push_back(name);
  return out;
}

absl::StatusOr<int64_t> ArchInt(const GgufFile& f, const std::string& arch,
                                const std::string& suffix) {
  return f.GetInt64(arch + "." + suffix);
}

absl::StatusOr<int64_t> ArchIntOr(const GgufFile& f, const std::string& arch,
                                  const std::string& suffix,
                                  int64_t default_value) {
  return f.GetInt64Or(arch + "." + suffix, default_value);
}

absl::StatusOr<float> ArchFloatOr(const GgufFile& f, const std::string& arch,
                                  const std::string& suffix,
                                  float default_value) {
  return f.GetFloatOr(arch + "." + suffix, default_value);
}

absl::Status ReadCommonConfig(const GgufFile& f, const std::string& arch,
                              ModelConfig* c) {
  c->architecture = arch;
  KVD_ASSIGN_OR_RETURN(std::string_view name,
                       f.GetStringOr("general.name", arch));
  c->name = std::string(name);
  KVD_ASSIGN_OR_RETURN(c->n_layers, ArchInt(f, arch, "block_count"));
  KVD_ASSIGN_OR_RETURN(c->d_model, ArchInt(f, arch, "embedding_length"));
  KVD_ASSIGN_OR_RETURN(c->d_ff, ArchInt(f, arch, "feed_forward_length"));
  KVD_ASSIGN_OR_RETURN(c->n_heads, ArchInt(f, arch, "attention.head_count"));
  KVD_ASSIGN_OR_RETURN(
      c->n_kv_heads, ArchIntOr(f, arch, "attention.head_count_kv", c->n_heads));
  KVD_ASSIGN_OR_RETURN(c->context_length,
                       ArchIntOr(f, arch, "context_length", 2048));
  const int64_t bounds[][2] = {{c->n_layers, 1024},
                               {c->d_model, 1 << 16},
                               {c->d_ff, 1 << 18},
                               {c->n_heads, 1024},
                               {c->n_kv_heads, 1024}};
  for (const auto& b : bounds) {
    if (b[0] <= 0 || b[0] > b[1]) {
      return absl::InvalidArgumentError(absl::StrCat(
          f.path(), ": implausible ", arch, " hyper-parameter ", b[0],
          " (expected 1..", b[1], "); the file's metadata is corrupt"));
    }
  }
  if (c->n_heads % c->n_kv_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(f.path(), ": head_count ", c->n_heads,
                     " is not a multiple of head_count_kv ", c->n_kv_heads));
  }
  KVD_ASSIGN_OR_RETURN(c->head_dim, ArchIntOr(f, arch, "attention.key_length",
                                              c->d_model / c->n_heads));
  KVD_ASSIGN_OR_RETURN(
      int64_t value_length,
      ArchIntOr(f, arch, "attention.value_length", c->head_dim));
  if (value_length != c->head_dim || c->head_dim <= 0 || c->head_dim > 1024 ||
      c->head_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        f.path(), ": unsupported head sizes key_length=", c->head_dim,
        " value_length=", value_length, " (need equal, even, <= 1024)"));
  }
  KVD_ASSIGN_OR_RETURN(c->rope_dim,
                       ArchIntOr(f, arch, "rope.dimension_count", c->head_dim));
  if (c->rope_dim <= 0 || c->rope_dim > c->head_dim || c->rope_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(f.path(), ": bad rope.dimension_count ", c->rope_dim));
  }
  KVD_ASSIGN_OR_RETURN(
      c->rms_eps,
      ArchFloatOr(f, arch, "attention.layer_norm_rms_epsilon", 1e-5f));
  KVD_ASSIGN_OR_RETURN(auto tokens, f.GetStringArray("tokenizer.ggml.tokens"));
  KVD_ASSIGN_OR_RETURN(
      c->vocab_size,
      ArchIntOr(f, arch, "vocab_size", static_cast<int64_t>(tokens.size())));
  return absl::OkStatus();
}

}  // namespace kvd::ops
