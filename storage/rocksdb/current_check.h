// A guard kvd runs before RocksDB opens a session database: a directory whose
// CURRENT file is gone but which still holds tables, blob files or
// write-ahead logs is a damaged database, not an empty one. RocksDB's
// create_if_missing would start a new database there, and its next open
// would delete those files as obsolete: every stored session lost.
#ifndef KVD_STORAGE_ROCKSDB_CURRENT_CHECK_H_
#define KVD_STORAGE_ROCKSDB_CURRENT_CHECK_H_

#include <string>

#include "absl/status/status.h"

namespace kvd::storage {

// Whether `name` is one of RocksDB's data files: NNNNNN.sst, .blob or .log.
bool IsRocksDataFile(const std::string& name);

// DATA_LOSS, naming a data file and how to repair or start over, if `dir`
// has data files but no CURRENT; OK otherwise (a new, empty or healthy
// directory, or one left by a first open that crashed before writing data).
absl::Status RefuseDataWithoutCurrent(const std::string& dir);

}  // namespace kvd::storage

#endif  // KVD_STORAGE_ROCKSDB_CURRENT_CHECK_H_
