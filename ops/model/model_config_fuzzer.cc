// libFuzzer entry point: bytes that parse as GGUF are read as a model config by
// their architecture's family and validated, as Model::Load does before it
// allocates weights. A family that sized anything by an unchecked metadata
// value (2^31 - 1 layers, say) is caught by libFuzzer's malloc limit, an
// out-of-range read by ASan.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "ops/gguf/gguf_file.h"
#include "ops/model/architecture.h"
#include "ops/model/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using kvd::ops::GgufFile;
  auto parsed = GgufFile::Parse("fuzz.gguf", data, size);
  if (!parsed.ok()) return 0;
  const GgufFile& f = **parsed;
  auto entry = kvd::ops::FindArchitecture(std::string(f.architecture()));
  if (!entry.ok()) return 0;
  auto config = (*entry)->read_config(f);
  if (!config.ok()) return 0;
  // A config the family accepted must be one Validate can judge; a valid one
  // has one layer setting per layer.
  if (config->Validate().ok() &&
      static_cast<int64_t>(config->layers.size()) != config->n_layers) {
    __builtin_trap();
  }
  return 0;
}
