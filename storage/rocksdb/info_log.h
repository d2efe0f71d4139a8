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
// Thread-safety: thread-safe; each line is one append(2)-mode write.
#ifndef KVD_STORAGE_ROCKSDB_INFO_LOG_H_
#define KVD_STORAGE_ROCKSDB_INFO_LOG_H_

#include <atomic>
#include <cstdarg>
#include <cstdint>
#include <memory>
#include <string>

#include "rocksdb/env.h"

namespace kvd::storage {

class InfoLogFile : public rocksdb::Logger {
 public:
  // Appends to `file` (created if missing). Lines are dropped, never fatal,
  // when it cannot be opened or written, and once `max_bytes` were written.
  explicit InfoLogFile(const std::string& file, int64_t max_bytes = 64 << 20);
  ~InfoLogFile() override;

  // Keeps the previous run's log: renames `dir`/LOG to `dir`/LOG.old
  // (replacing an older one), then opens a fresh `dir`/LOG.
  static std::shared_ptr<InfoLogFile> RotateAndOpen(const std::string& dir);

  using rocksdb::Logger::Logv;
  void Logv(const char* format, va_list ap) override;

  int64_t lines_written() const { return written_.load(); }
  int64_t lines_dropped() const { return dropped_.load(); }

 protected:
  rocksdb::Status CloseImpl() override;

 private:
  std::atomic<int> fd_{-1};
  const int64_t max_bytes_;
  std::atomic<int64_t> bytes_{0};
  std::atomic<int64_t> written_{0};
  std::atomic<int64_t> dropped_{0};
};

}  // namespace kvd::storage

#endif  // KVD_STORAGE_ROCKSDB_INFO_LOG_H_
