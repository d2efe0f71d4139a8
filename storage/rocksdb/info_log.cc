#include "storage/rocksdb/info_log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <utility>

namespace kvd::storage {

InfoLogFile::InfoLogFile(std::string file, int64_t max_bytes)
    : file_(std::move(file)), max_bytes_(max_bytes) {
  absl::MutexLock lock(&mu_);
  OpenLocked();
}

InfoLogFile::~InfoLogFile() { CloseImpl().PermitUncheckedError(); }

void InfoLogFile::OpenLocked() {
  fd_ = ::open(file_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  struct stat st;
  bytes_ = fd_ >= 0 && ::fstat(fd_, &st) == 0 ? st.st_size : 0;
}

void InfoLogFile::Logv(const char* format, va_list ap) {
  // RocksDB's own line prefix (local time to the microsecond, thread id), so
  // tools that read RocksDB LOG files still parse these lines.
  char line[4096];
  struct timeval now;
  gettimeofday(&now, nullptr);
  struct tm t;
  localtime_r(&now.tv_sec, &t);
  int n = std::snprintf(line, sizeof(line),
                        "%04d/%02d/%02d-%02d:%02d:%02d.%06ld %lx ",
                        t.tm_year + 1900, t.tm_mon + 1, t.tm_mday, t.tm_hour,
                        t.tm_min, t.tm_sec, static_cast<long>(now.tv_usec),
                        static_cast<unsigned long>(::syscall(SYS_gettid)));
  va_list copy;
  va_copy(copy, ap);
  const int body = std::vsnprintf(
      line + n, sizeof(line) - static_cast<size_t>(n) - 1, format, copy);
  va_end(copy);
  if (body > 0) {
    n += std::min(body, static_cast<int>(sizeof(line)) - n - 2);
  }
  if (line[n - 1] != '\n') line[n++] = '\n';

  absl::MutexLock lock(&mu_);
  if (fd_ >= 0 && bytes_ >= max_bytes_) {
    ::close(fd_);
    // A failed rename leaves LOG growing past the cap: better than nothing.
    ::rename(file_.c_str(), (file_ + ".old").c_str());
    OpenLocked();
  }
  if (fd_ >= 0 && ::write(fd_, line, static_cast<size_t>(n)) == n) {
    bytes_ += n;
    ++written_;
  } else {
    ++dropped_;
  }
}

int64_t InfoLogFile::lines_written() const {
  absl::MutexLock lock(&mu_);
  return written_;
}

int64_t InfoLogFile::lines_dropped() const {
  absl::MutexLock lock(&mu_);
  return dropped_;
}

rocksdb::Status InfoLogFile::CloseImpl() {
  absl::MutexLock lock(&mu_);
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  return rocksdb::Status::OK();
}

}  // namespace kvd::storage
