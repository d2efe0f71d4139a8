// The disk-read bandwidth probe: a figure that is positive and finite (never
// a speed threshold: shared machines vary), the file it wrote is gone
// afterwards, and bad requests are refused with a message naming the problem.
#include "storage/probe/disk_bandwidth.h"

#include <dirent.h>
#include <sys/stat.h>

#include <cmath>
#include <cstdlib>
#include <iostream>
#include <string>

#include "gtest/gtest.h"

namespace kvd::storage {
namespace {

// A fresh, empty directory under the test's temporary directory.
std::string FreshDir(const std::string& name) {
  const char* t = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(t != nullptr ? t : "/tmp") + "/" + name;
  mkdir(dir.c_str(), 0755);
  return dir;
}

int EntriesIn(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return -1;
  int n = 0;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") ++n;
  }
  closedir(d);
  return n;
}

TEST(DiskReadBandwidth, MeasuresAndCleansUp) {
  const std::string dir = FreshDir("probe");
  ASSERT_EQ(EntriesIn(dir), 0);
  absl::StatusOr<DiskReadBandwidth> b =
      MeasureDiskReadBandwidth(dir, 2 * kDiskProbeBufferBytes);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(std::isfinite(b->bytes_per_s) && b->bytes_per_s > 0)
      << b->bytes_per_s;
  EXPECT_EQ(b->file_bytes, 2 * kDiskProbeBufferBytes);
  EXPECT_EQ(EntriesIn(dir), 0) << "the probe left its file behind";
  std::cout << "read " << b->bytes_per_s
            << " B/s, page cache dropped: " << b->cache_dropped << "\n";

  // A size that is not a whole number of buffers is read to the last byte.
  b = MeasureDiskReadBandwidth(dir, kDiskProbeBufferBytes + 12345);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->file_bytes, kDiskProbeBufferBytes + 12345);
  EXPECT_EQ(EntriesIn(dir), 0);
}

TEST(DiskReadBandwidth, BadRequestsAreRefused) {
  absl::StatusOr<DiskReadBandwidth> b =
      MeasureDiskReadBandwidth("/no/such/dir", 2 * kDiskProbeBufferBytes);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("/no/such/dir"), std::string::npos)
      << b.status();

  b = MeasureDiskReadBandwidth(FreshDir("small"), 1024);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(b.status().message().find("too small"), std::string::npos)
      << b.status();
}

}  // namespace
}  // namespace kvd::storage
