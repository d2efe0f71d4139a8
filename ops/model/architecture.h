// The table of supported model families.
//
// Each family lives in one file under ops/model/families/ and registers itself
// here with the GGUF architecture names it handles and a function that reads
// the file's metadata into a ModelConfig. Nothing else in kvd switches on the
// architecture.
//
//   KVD_REGISTER_ARCHITECTURE(llama, {"llama"}, &ReadLlamaConfig);
//
// Thread-safety: registration happens during static initialisation; lookups are
// read-only.
#ifndef KVD_OPS_MODEL_ARCHITECTURE_H_
#define KVD_OPS_MODEL_ARCHITECTURE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ops/gguf/gguf_file.h"
#include "ops/model/model_config.h"

namespace kvd::ops {

using ReadConfigFn = absl::StatusOr<ModelConfig> (*)(const GgufFile& file);

struct ArchitectureEntry {
  std::string family;              // "llama", "qwen2", "gemma3"
  std::vector<std::string> names;  // general.architecture values handled
  ReadConfigFn read_config;
};

bool RegisterArchitecture(ArchitectureEntry entry);

// The family for general.architecture, or INVALID_ARGUMENT listing what is
// supported.
absl::StatusOr<const ArchitectureEntry*> FindArchitecture(
    const std::string& name);

std::vector<std::string> SupportedArchitectures();

// Helpers shared by the families: "<arch>.<suffix>" metadata with clear errors.
absl::StatusOr<int64_t> ArchInt(const GgufFile& f, const std::string& arch,
                                const std::string& suffix);
absl::StatusOr<int64_t> ArchIntOr(const GgufFile& f, const std::string& arch,
                                  const std::string& suffix,
                                  int64_t default_value);
absl::StatusOr<float> ArchFloatOr(const GgufFile& f, const std::string& arch,
                                  const std::string& suffix,
                                  float default_value);
// "<arch>.rope.freq_base", or `default_value` when absent; INVALID_ARGUMENT
// naming the key unless it is a finite number > 0.
absl::StatusOr<float> ArchRopeBase(const GgufFile& f, const std::string& arch,
                                   float default_value);
// Fills the fields every family shares (sizes, heads, eps, context, vocab from
// the token list) and checks them (ModelConfig::ValidateSizes), so a family
// may size per-layer settings by n_layers afterwards. Errors name the file
// and, for a bad value, its key.
absl::Status ReadCommonConfig(const GgufFile& f, const std::string& arch,
                              ModelConfig* c);

}  // namespace kvd::ops

#define KVD_REGISTER_ARCHITECTURE(id, ...)     \
  static const bool kvd_arch_registered_##id = \
      ::kvd::ops::RegisterArchitecture(        \
          ::kvd::ops::ArchitectureEntry{#id, __VA_ARGS__})

#endif  // KVD_OPS_MODEL_ARCHITECTURE_H_
