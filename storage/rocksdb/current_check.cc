#include "storage/rocksdb/current_check.h"

#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"

namespace kvd::storage {

bool IsRocksDataFile(const std::string& name) {
  const size_t dot = name.find('.');
  if (dot == 0 || dot == std::string::npos) return false;
  for (size_t i = 0; i < dot; ++i) {
    if (name[i] < '0' || name[i] > '9') return false;
  }
  const std::string ext = name.substr(dot);
  return ext == ".sst" || ext == ".blob" || ext == ".log";
}

absl::Status RefuseDataWithoutCurrent(const std::string& dir) {
  namespace fs = std::filesystem;
  // The error_code forms throughout: a throw here would end the process.
  std::error_code ec;
  if (fs::exists(fs::path(dir) / "CURRENT", ec)) return absl::OkStatus();
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!IsRocksDataFile(name)) continue;
    return absl::DataLossError(absl::StrCat(
        "the session database at ", dir, " has data files (", name,
        ") but no CURRENT file, so it is damaged; kvd will not open it, "
        "because a new database there would delete those files. Restore the "
        "directory from a backup, or write the name of its newest "
        "MANIFEST-* file into ",
        (fs::path(dir) / "CURRENT").string(),
        " (one line), or move the directory aside to start with no "
        "sessions"));
  }
  return absl::OkStatus();
}

}  // namespace kvd::storage
