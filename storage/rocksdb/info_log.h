// RocksDB's diagnostic log (the LOG file in the database directory), written
// by kvd rather than by RocksDB's own EnvLogger.
//
// Why: Debian's librocksdb is built with assertions enabled, and its
// EnvLogger asserts when a line is logged after an earlier write to LOG
// failed. On a full disk the first failed write is followed by RocksDB
// logging that very error, so the process aborted (SIGABRT) instead of
// returning RESOURCE_EXHAUSTED. This logger never fails: a line that cannot be
// written is counted and dropped, and the database carries on.
//
// It appends to LOG (a run that fails to take the database's lock adds a few
// lines to the live log, never renames it) and, once LOG holds `max_bytes`,
// renames it to LOG.old (replacing the previous one) and starts a new LOG.
//
// Thread-safety: thread-safe.
#ifndef KVD_STORAGE_ROCKSDB_INFO_LOG_H_
#define KVD_STORAGE_ROCKSDB_INFO_LOG_H_

#include <cstdarg>
#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "rocksdb/env.h"

namespace kvd::storage {

class InfoLogFile : public rocksdb::Logger {
 public:
  explicit InfoLogFile(std::string file, int64_t max_bytes = 64 << 20);
  ~InfoLogFile() override;

  using rocksdb::Logger::Logv;
  void Logv(const char* format, va_list ap) override;

  int64_t lines_written() const;
  int64_t lines_dropped() const;

 protected:
  rocksdb::Status CloseImpl() override;

 private:
  void OpenLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string file_;
  const int64_t max_bytes_;
  mutable absl::Mutex mu_;
  int fd_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;  // in the current LOG
  int64_t written_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvd::storage

#endif  // KVD_STORAGE_ROCKSDB_INFO_LOG_H_
