// Where kvd caches model files: $KVD_MODEL_DIR, else
// ${XDG_CACHE_HOME:-$HOME/.cache}/kvd/models. tools/fetch_models.sh writes
// there; the CLI and the tests read from there.
#ifndef KVD_BASE_MODEL_DIR_H_
#define KVD_BASE_MODEL_DIR_H_

#include <string>

namespace kvd {

std::string ModelCacheDir();

// ModelCacheDir() + "/" + file.
std::string CachedModelPath(const std::string& file);

}  // namespace kvd

#endif  // KVD_BASE_MODEL_DIR_H_
