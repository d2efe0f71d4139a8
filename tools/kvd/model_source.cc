#include "tools/kvd/model_source.h"

#include <sys/stat.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "base/model_dir.h"

namespace kvd::cli {
namespace {

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 &&
         (S_ISREG(st.st_mode) || S_ISDIR(st.st_mode));
}

}  // namespace

absl::StatusOr<std::string> ResolveModel(const std::string& name_or_path) {
  std::string file;
  if (name_or_path == "smollm2") file = "SmolLM2-135M-Instruct.Q4_1.gguf";
  if (name_or_path == "gemma3") file = "gemma-3-270m-q4_k_m.gguf";
  if (!file.empty()) {
    const std::string path = CachedModelPath(file);
    if (Exists(path)) return path;
    return absl::NotFoundError(
        absl::StrCat("model '", name_or_path, "' is not cached at ", path,
                     "; fetch it with: tools/fetch_models.sh ", name_or_path));
  }
  if (Exists(name_or_path)) return name_or_path;
  return absl::NotFoundError(
      absl::StrCat("no model file at '", name_or_path,
                   "'; pass a GGUF file, a Hugging Face checkpoint directory, "
                   "or one of: smollm2, gemma3 (fetched "
                   "by tools/fetch_models.sh)"));
}

}  // namespace kvd::cli
