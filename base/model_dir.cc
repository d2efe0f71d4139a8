#include "base/model_dir.h"

#include <cstdlib>

namespace kvd {

std::string ModelCacheDir() {
  if (const char* dir = std::getenv("KVD_MODEL_DIR"); dir != nullptr && *dir)
    return dir;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg) {
    return std::string(xdg) + "/kvd/models";
  }
  const char* home = std::getenv("HOME");
  return std::string(home != nullptr ? home : ".") + "/.cache/kvd/models";
}

std::string CachedModelPath(const std::string& file) {
  return ModelCacheDir() + "/" + file;
}

}  // namespace kvd
