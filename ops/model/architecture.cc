#include "ops/model/architecture.h"

#include <cmath>
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

namespace {

absl::Status BadMetadata(const GgufFile& f, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(
      f.path(), ": ", what, "; the file's metadata is corrupt or unsupported"));
}

}  // namespace

absl::StatusOr<float> ArchRopeBase(const GgufFile& f, const std::string& arch,
                                   float default_value) {
  const std::string key = arch + ".rope.freq_base";
  KVD_ASSIGN_OR_RETURN(float base, f.GetFloatOr(key, default_value));
  // NaN fails every comparison, so test for the good range.
  if (!(std::isfinite(base) && base > 0.0f)) {
    return BadMetadata(
        f, absl::StrCat(key, " is ", base, "; it must be a finite number > 0"));
  }
  return base;
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
  // Sizes are validated at the end; only guard the division here.
  KVD_ASSIGN_OR_RETURN(
      c->head_dim,
      ArchIntOr(f, arch, "attention.key_length",
                c->n_heads > 0 ? c->d_model / c->n_heads : int64_t{0}));
  KVD_ASSIGN_OR_RETURN(
      int64_t value_length,
      ArchIntOr(f, arch, "attention.value_length", c->head_dim));
  if (value_length != c->head_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        f.path(), ": key_length ", c->head_dim, " != value_length ",
        value_length, "; kvd needs equal key and value head sizes"));
  }
  KVD_ASSIGN_OR_RETURN(c->rope_dim,
                       ArchIntOr(f, arch, "rope.dimension_count", c->head_dim));
  KVD_ASSIGN_OR_RETURN(
      c->rms_eps,
      ArchFloatOr(f, arch, "attention.layer_norm_rms_epsilon", 1e-5f));
  if (!(std::isfinite(c->rms_eps) && c->rms_eps >= 0.0f)) {
    return BadMetadata(
        f, absl::StrCat(arch, ".attention.layer_norm_rms_epsilon is ",
                        c->rms_eps, "; it must be a finite number >= 0"));
  }
  KVD_ASSIGN_OR_RETURN(auto tokens, f.GetStringArray("tokenizer.ggml.tokens"));
  KVD_ASSIGN_OR_RETURN(
      c->vocab_size,
      ArchIntOr(f, arch, "vocab_size", static_cast<int64_t>(tokens.size())));
  // Before any family sizes per-layer settings by block_count (2^31 - 1
  // layers would otherwise end in bad_alloc, not in an error).
  if (absl::Status s = c->ValidateSizes(); !s.ok()) {
    return BadMetadata(f, s.message());
  }
  return absl::OkStatus();
}

}  // namespace kvd::ops
