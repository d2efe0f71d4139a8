#include "storage/rocksdb/info_log.h"

#include <fcntl.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <system_error>

namespace kvd::storage {

InfoLogFile::InfoLogFile(const std::string& file, int64_t max_bytes)
    : max_bytes_(max_bytes) {
  fd_ = ::open(file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
}

InfoLogFile::~InfoLogFile() { CloseImpl().PermitUncheckedError(); }

std::shared_ptr<InfoLogFile> InfoLogFile::RotateAndOpen(
    const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;  // a failed rename only costs the previous run's log
  fs::rename(fs::path(dir) / "LOG", fs::path(dir) / "LOG.old", ec);
  return std::make_shared<InfoLogFile>((fs::path(dir) / "LOG").string());
}

void InfoLogFile::Logv(const char* format, va_list ap) {
  const int fd = fd_.load();
  if (fd < 0 || bytes_.load() >= max_bytes_) {
    dropped_.fetch_add(1);
    return;
  }
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
  const ssize_t w = ::write(fd, line, static_cast<size_t>(n));
  if (w == n) {
    bytes_.fetch_add(n);
    written_.fetch_add(1);
  } else {
    dropped_.fetch_add(1);
  }
}

rocksdb::Status InfoLogFile::CloseImpl() {
  const int fd = fd_.exchange(-1);
  if (fd >= 0) ::close(fd);
  return rocksdb::Status::OK();
}

}  // namespace kvd::storage
