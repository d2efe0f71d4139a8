#include "storage/rocksdb/fault_file_system_for_test.h"

#include <unistd.h>

#include <utility>

namespace kvd::storage::testing {
namespace {

using rocksdb::IODebugContext;
using rocksdb::IOOptions;
using rocksdb::IOStatus;
using rocksdb::Slice;

IOStatus PowerOff() { return IOStatus::IOError("simulated power loss"); }

std::string DirOf(const std::string& fname) {
  const size_t slash = fname.rfind('/');
  return slash == std::string::npos ? "." : fname.substr(0, slash);
}

}  // namespace

class DropUnsyncedFileSystemForTest::File
    : public rocksdb::FSWritableFileOwnerWrapper {
 public:
  File(std::unique_ptr<rocksdb::FSWritableFile> f, std::string name,
       DropUnsyncedFileSystemForTest* fs)
      : FSWritableFileOwnerWrapper(std::move(f)),
        name_(std::move(name)),
        fs_(fs) {}

  IOStatus Append(const Slice& data, const IOOptions& o,
                  IODebugContext* dbg) override {
    if (fs_->dead()) return PowerOff();
    IOStatus s = target()->Append(data, o, dbg);
    if (s.ok()) fs_->OnAppend(name_, static_cast<int64_t>(data.size()));
    return s;
  }
  IOStatus Append(const Slice& data, const IOOptions& o,
                  const rocksdb::DataVerificationInfo& info,
                  IODebugContext* dbg) override {
    if (fs_->dead()) return PowerOff();
    IOStatus s = target()->Append(data, o, info, dbg);
    if (s.ok()) fs_->OnAppend(name_, static_cast<int64_t>(data.size()));
    return s;
  }
  IOStatus PositionedAppend(const Slice&, uint64_t, const IOOptions&,
                            IODebugContext*) override {
    return IOStatus::NotSupported("PositionedAppend in the power-loss double");
  }
  IOStatus PositionedAppend(const Slice&, uint64_t, const IOOptions&,
                            const rocksdb::DataVerificationInfo&,
                            IODebugContext*) override {
    return IOStatus::NotSupported("PositionedAppend in the power-loss double");
  }
  bool use_direct_io() const override { return false; }
  IOStatus Truncate(uint64_t, const IOOptions&, IODebugContext*) override {
    return IOStatus::NotSupported("Truncate in the power-loss double");
  }
  IOStatus Flush(const IOOptions& o, IODebugContext* dbg) override {
    if (fs_->dead()) return PowerOff();
    return target()->Flush(o, dbg);
  }
  IOStatus Sync(const IOOptions& o, IODebugContext* dbg) override {
    if (fs_->dead()) return PowerOff();
    IOStatus s = target()->Sync(o, dbg);
    if (s.ok()) fs_->OnSync(name_);
    return s;
  }
  IOStatus Fsync(const IOOptions& o, IODebugContext* dbg) override {
    if (fs_->dead()) return PowerOff();
    IOStatus s = target()->Fsync(o, dbg);
    if (s.ok()) fs_->OnSync(name_);
    return s;
  }
  IOStatus RangeSync(uint64_t offset, uint64_t nbytes, const IOOptions& o,
                     IODebugContext* dbg) override {
    if (fs_->dead()) return PowerOff();
    return target()->RangeSync(offset, nbytes, o, dbg);  // not counted
  }
  IOStatus Close(const IOOptions& o, IODebugContext* dbg) override {
    // Closing is harmless even when the power is off.
    return target()->Close(o, dbg);
  }

 private:
  std::string name_;
  DropUnsyncedFileSystemForTest* fs_;
};

class DropUnsyncedFileSystemForTest::Directory
    : public rocksdb::FSDirectoryWrapper {
 public:
  Directory(std::unique_ptr<rocksdb::FSDirectory> d, std::string name,
            DropUnsyncedFileSystemForTest* fs)
      : FSDirectoryWrapper(std::move(d)), name_(std::move(name)), fs_(fs) {}
  IOStatus Fsync(const IOOptions& o, IODebugContext* dbg) override {
    if (fs_->dead()) return PowerOff();
    IOStatus s = FSDirectoryWrapper::Fsync(o, dbg);
    if (s.ok()) fs_->OnDirSync(name_);
    return s;
  }
  IOStatus FsyncWithDirOptions(
      const IOOptions& o, IODebugContext* dbg,
      const rocksdb::DirFsyncOptions& options) override {
    if (fs_->dead()) return PowerOff();
    IOStatus s = FSDirectoryWrapper::FsyncWithDirOptions(o, dbg, options);
    if (s.ok()) fs_->OnDirSync(name_);
    return s;
  }

 private:
  std::string name_;
  DropUnsyncedFileSystemForTest* fs_;
};

DropUnsyncedFileSystemForTest::DropUnsyncedFileSystemForTest()
    : FileSystemWrapper(rocksdb::FileSystem::Default()) {}

bool DropUnsyncedFileSystemForTest::dead() const {
  absl::MutexLock lock(&mu_);
  return dead_;
}

void DropUnsyncedFileSystemForTest::OnAppend(const std::string& fname,
                                             int64_t bytes) {
  absl::MutexLock lock(&mu_);
  files_[fname].size += bytes;
}

void DropUnsyncedFileSystemForTest::OnSync(const std::string& fname) {
  absl::MutexLock lock(&mu_);
  FileState& f = files_[fname];
  f.synced_size = f.size;
}

void DropUnsyncedFileSystemForTest::OnDirSync(const std::string& dir) {
  absl::MutexLock lock(&mu_);
  for (auto& [name, state] : files_) {
    if (DirOf(name) == dir) state.entry_durable = true;
  }
}

IOStatus DropUnsyncedFileSystemForTest::NewWritableFile(
    const std::string& fname, const rocksdb::FileOptions& options,
    std::unique_ptr<rocksdb::FSWritableFile>* result, IODebugContext* dbg) {
  if (dead()) return PowerOff();
  std::unique_ptr<rocksdb::FSWritableFile> f;
  IOStatus s = target()->NewWritableFile(fname, options, &f, dbg);
  if (!s.ok()) return s;
  {
    absl::MutexLock lock(&mu_);
    files_[fname] = FileState{};  // created (or truncated) empty
  }
  *result = std::make_unique<File>(std::move(f), fname, this);
  return s;
}

IOStatus DropUnsyncedFileSystemForTest::ReopenWritableFile(
    const std::string& fname, const rocksdb::FileOptions& options,
    std::unique_ptr<rocksdb::FSWritableFile>* result, IODebugContext* dbg) {
  if (dead()) return PowerOff();
  uint64_t existing = 0;
  const bool existed =
      target()->GetFileSize(fname, IOOptions(), &existing, dbg).ok();
  std::unique_ptr<rocksdb::FSWritableFile> f;
  IOStatus s = target()->ReopenWritableFile(fname, options, &f, dbg);
  if (!s.ok()) return s;
  {
    absl::MutexLock lock(&mu_);
    if (files_.count(fname) == 0) {
      // Bytes from before we saw the file count as durable.
      FileState st;
      st.size = st.synced_size = static_cast<int64_t>(existing);
      st.entry_durable = existed;
      files_[fname] = st;
    }
  }
  *result = std::make_unique<File>(std::move(f), fname, this);
  return s;
}

IOStatus DropUnsyncedFileSystemForTest::ReuseWritableFile(
    const std::string& fname, const std::string& old_fname,
    const rocksdb::FileOptions& options,
    std::unique_ptr<rocksdb::FSWritableFile>* result, IODebugContext* dbg) {
  return IOStatus::NotSupported("log recycling in the power-loss double");
}

IOStatus DropUnsyncedFileSystemForTest::NewDirectory(
    const std::string& name, const IOOptions& io_opts,
    std::unique_ptr<rocksdb::FSDirectory>* result, IODebugContext* dbg) {
  std::unique_ptr<rocksdb::FSDirectory> d;
  IOStatus s = target()->NewDirectory(name, io_opts, &d, dbg);
  if (!s.ok()) return s;
  std::string dir = name;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  *result = std::make_unique<Directory>(std::move(d), dir, this);
  return s;
}

IOStatus DropUnsyncedFileSystemForTest::DeleteFile(const std::string& fname,
                                                   const IOOptions& options,
                                                   IODebugContext* dbg) {
  if (dead()) return PowerOff();
  IOStatus s = target()->DeleteFile(fname, options, dbg);
  if (s.ok()) {
    absl::MutexLock lock(&mu_);
    files_.erase(fname);
  }
  return s;
}

IOStatus DropUnsyncedFileSystemForTest::RenameFile(const std::string& src,
                                                   const std::string& target,
                                                   const IOOptions& options,
                                                   IODebugContext* dbg) {
  if (dead()) return PowerOff();
  IOStatus s = FileSystemWrapper::RenameFile(src, target, options, dbg);
  if (s.ok()) {
    absl::MutexLock lock(&mu_);
    auto it = files_.find(src);
    if (it != files_.end()) {
      FileState st = it->second;
      st.entry_durable = true;  // simplification: see the header
      files_.erase(it);
      files_[target] = st;
    } else {
      files_.erase(target);
    }
  }
  return s;
}

int64_t DropUnsyncedFileSystemForTest::SimulatePowerLoss() {
  absl::MutexLock lock(&mu_);
  dead_ = true;
  int64_t dropped = 0;
  for (const auto& [name, st] : files_) {
    if (!st.entry_durable) {
      dropped += st.size;
      ::unlink(name.c_str());
    } else if (st.size > st.synced_size) {
      dropped += st.size - st.synced_size;
      if (::truncate(name.c_str(), st.synced_size) != 0) dropped = -1;
    }
  }
  files_.clear();
  return dropped;
}

void DropUnsyncedFileSystemForTest::Revive() {
  absl::MutexLock lock(&mu_);
  dead_ = false;
  files_.clear();
}

class NoSpaceFileSystemForTest::File
    : public rocksdb::FSWritableFileOwnerWrapper {
 public:
  File(std::unique_ptr<rocksdb::FSWritableFile> f, NoSpaceFileSystemForTest* fs)
      : FSWritableFileOwnerWrapper(std::move(f)), fs_(fs) {}
  IOStatus Append(const Slice& data, const IOOptions& o,
                  IODebugContext* dbg) override {
    if (!fs_->Spend(static_cast<int64_t>(data.size()))) {
      return IOStatus::NoSpace("NoSpaceFileSystemForTest: budget spent");
    }
    return target()->Append(data, o, dbg);
  }
  IOStatus Append(const Slice& data, const IOOptions& o,
                  const rocksdb::DataVerificationInfo& info,
                  IODebugContext* dbg) override {
    if (!fs_->Spend(static_cast<int64_t>(data.size()))) {
      return IOStatus::NoSpace("NoSpaceFileSystemForTest: budget spent");
    }
    return target()->Append(data, o, info, dbg);
  }
  IOStatus PositionedAppend(const Slice& data, uint64_t offset,
                            const IOOptions& o, IODebugContext* dbg) override {
    if (!fs_->Spend(static_cast<int64_t>(data.size()))) {
      return IOStatus::NoSpace("NoSpaceFileSystemForTest: budget spent");
    }
    return target()->PositionedAppend(data, offset, o, dbg);
  }

 private:
  NoSpaceFileSystemForTest* fs_;
};

NoSpaceFileSystemForTest::NoSpaceFileSystemForTest()
    : FileSystemWrapper(rocksdb::FileSystem::Default()) {}

void NoSpaceFileSystemForTest::SetBudget(int64_t bytes) {
  absl::MutexLock lock(&mu_);
  budget_ = bytes;
}

int64_t NoSpaceFileSystemForTest::no_space_errors() const {
  absl::MutexLock lock(&mu_);
  return errors_;
}

bool NoSpaceFileSystemForTest::Spend(int64_t bytes) {
  absl::MutexLock lock(&mu_);
  if (budget_ < 0) return true;
  if (bytes > budget_) {
    ++errors_;
    return false;
  }
  budget_ -= bytes;
  return true;
}

IOStatus NoSpaceFileSystemForTest::NewWritableFile(
    const std::string& fname, const rocksdb::FileOptions& options,
    std::unique_ptr<rocksdb::FSWritableFile>* result, IODebugContext* dbg) {
  std::unique_ptr<rocksdb::FSWritableFile> f;
  IOStatus s = target()->NewWritableFile(fname, options, &f, dbg);
  if (s.ok()) *result = std::make_unique<File>(std::move(f), this);
  return s;
}

}  // namespace kvd::storage::testing
