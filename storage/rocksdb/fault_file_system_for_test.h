// Test doubles of rocksdb::FileSystem for the RocksDB tier's failure tests.
// Both wrap the real file system and are for tests only.
//
// DropUnsyncedFileSystemForTest simulates power loss. It tracks, for every
// file written through it, how many bytes were appended and how many were
// made durable by Sync/Fsync, and whether the file's directory entry was made
// durable by fsyncing its directory. SimulatePowerLoss() then (1) makes every
// further mutating call fail, as if the machine were off, so the DB being
// torn down cannot write anything more, and (2) truncates each tracked file
// to its last synced size and deletes files whose directory entry was never
// synced. Revive() lets a new DB open.
// Simplifications, all in the direction of keeping more data than a real
// disk might, so a pass here is necessary but not sufficient:
//   - RangeSync counts as not durable; Sync/Fsync make the whole file durable.
//   - Renames and deletions are durable at once (a real file system may
//     revert them until the directory is fsynced). RocksDB fsyncs the
//     directory after renaming CURRENT anyway.
//   - Data is lost at whole-append granularity beyond the synced size; real
//     disks may also tear a sector or reorder unsynced writes.
//   - Files that existed before the wrapper saw them are never touched.
//
// NoSpaceFileSystemForTest simulates a full disk: appends fail with
// IOStatus::NoSpace once a byte budget is spent (the failing append writes
// nothing), until SetBudget gives more room.
//
// Thread-safety: thread-safe (RocksDB calls them from background threads).
#ifndef KVD_STORAGE_ROCKSDB_FAULT_FILE_SYSTEM_FOR_TEST_H_
#define KVD_STORAGE_ROCKSDB_FAULT_FILE_SYSTEM_FOR_TEST_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "rocksdb/file_system.h"

namespace kvd::storage::testing {

class DropUnsyncedFileSystemForTest : public rocksdb::FileSystemWrapper {
 public:
  DropUnsyncedFileSystemForTest();
  static const char* kClassName() { return "DropUnsyncedFileSystemForTest"; }
  const char* Name() const override { return kClassName(); }

  // Power loss: see the file comment. Returns how many bytes were dropped.
  int64_t SimulatePowerLoss();
  // Power back on: calls pass through again; tracking starts afresh.
  void Revive();

  rocksdb::IOStatus NewWritableFile(
      const std::string& fname, const rocksdb::FileOptions& options,
      std::unique_ptr<rocksdb::FSWritableFile>* result,
      rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus ReopenWritableFile(
      const std::string& fname, const rocksdb::FileOptions& options,
      std::unique_ptr<rocksdb::FSWritableFile>* result,
      rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus ReuseWritableFile(
      const std::string& fname, const std::string& old_fname,
      const rocksdb::FileOptions& options,
      std::unique_ptr<rocksdb::FSWritableFile>* result,
      rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus NewDirectory(const std::string& name,
                                 const rocksdb::IOOptions& io_opts,
                                 std::unique_ptr<rocksdb::FSDirectory>* result,
                                 rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus DeleteFile(const std::string& fname,
                               const rocksdb::IOOptions& options,
                               rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus RenameFile(const std::string& src,
                               const std::string& target,
                               const rocksdb::IOOptions& options,
                               rocksdb::IODebugContext* dbg) override;

 private:
  class File;
  class Directory;
  struct FileState {
    int64_t size = 0;
    int64_t synced_size = 0;
    bool entry_durable = false;
  };
  friend class File;
  friend class Directory;

  bool dead() const;
  void OnAppend(const std::string& fname, int64_t bytes);
  void OnSync(const std::string& fname);
  void OnDirSync(const std::string& dir);

  mutable absl::Mutex mu_;
  bool dead_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, FileState> files_ ABSL_GUARDED_BY(mu_);
};

class NoSpaceFileSystemForTest : public rocksdb::FileSystemWrapper {
 public:
  NoSpaceFileSystemForTest();
  static const char* kClassName() { return "NoSpaceFileSystemForTest"; }
  const char* Name() const override { return kClassName(); }

  // Bytes that may still be appended; negative = unlimited (the default).
  void SetBudget(int64_t bytes);
  int64_t no_space_errors() const;

  rocksdb::IOStatus NewWritableFile(
      const std::string& fname, const rocksdb::FileOptions& options,
      std::unique_ptr<rocksdb::FSWritableFile>* result,
      rocksdb::IODebugContext* dbg) override;

 private:
  class File;
  bool Spend(int64_t bytes);

  mutable absl::Mutex mu_;
  int64_t budget_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t errors_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvd::storage::testing

#endif  // KVD_STORAGE_ROCKSDB_FAULT_FILE_SYSTEM_FOR_TEST_H_
