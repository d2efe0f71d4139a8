// The RocksDB LOG writer never aborts and never blocks the database: lines go
// to the file with RocksDB's prefix, a full device (/dev/full) drops them and
// counts them, the size cap holds, and a reopen keeps the previous log.
#include "storage/rocksdb/info_log.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rocksdb/env.h"

namespace kvd::storage {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::testing::Not;

std::string TestDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir =
      std::string(tmp != nullptr ? tmp : "/tmp") + "/" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(InfoLogFile, WritesPrefixedLinesAndKeepsThePreviousLog) {
  const std::string dir = TestDir("rotate");
  {
    auto log = InfoLogFile::RotateAndOpen(dir);
    rocksdb::Info(log, "first run, table #%d", 7);
    EXPECT_EQ(log->lines_written(), 1);
  }
  auto log = InfoLogFile::RotateAndOpen(dir);
  rocksdb::Warn(log, "second run");
  EXPECT_THAT(ReadFile(dir + "/LOG.old"),
              MatchesRegex("[0-9/]+-[0-9:.]+ [0-9a-f]+ .*first run, table "
                           "#7\n"));
  const std::string current = ReadFile(dir + "/LOG");
  EXPECT_THAT(current, HasSubstr("second run\n"));
  EXPECT_THAT(current, Not(HasSubstr("first run")));
}

// What aborted kvd on a full disk with RocksDB's EnvLogger: logging after a
// failed write. /dev/full fails every write with ENOSPC.
TEST(InfoLogFile, FullDeviceDropsLinesAndCarriesOn) {
  InfoLogFile log("/dev/full");
  for (int i = 0; i < 100; ++i) {
    rocksdb::Error(&log, "error %d after a failed write", i);
  }
  log.Flush();
  EXPECT_EQ(log.lines_written(), 0);
  EXPECT_EQ(log.lines_dropped(), 100);
}

TEST(InfoLogFile, UnopenableFileDropsLines) {
  InfoLogFile log(TestDir("missing") + "/no/such/dir/LOG");
  rocksdb::Info(&log, "nowhere to go");
  EXPECT_EQ(log.lines_dropped(), 1);
}

TEST(InfoLogFile, StopsAtTheSizeCap) {
  const std::string file = TestDir("cap") + "/LOG";
  InfoLogFile log(file, /*max_bytes=*/1000);
  for (int i = 0; i < 100; ++i)
    rocksdb::Info(&log, "%s", std::string(90, 'x').c_str());
  EXPECT_GT(log.lines_written(), 0);
  EXPECT_GT(log.lines_dropped(), 0);
  EXPECT_EQ(log.lines_written() + log.lines_dropped(), 100);
  const auto size = std::filesystem::file_size(file);
  EXPECT_LT(size, 1000u + 200u);  // at most one line past the cap
}

TEST(InfoLogFile, LongLinesAreCutNotOverrun) {
  const std::string file = TestDir("long") + "/LOG";
  InfoLogFile log(file);
  const std::string big(10000, 'y');
  rocksdb::Info(&log, "%s", big.c_str());
  const std::string text = ReadFile(file);
  EXPECT_LT(text.size(), 4096u + 1);
  EXPECT_EQ(text.back(), '\n');
}

}  // namespace
}  // namespace kvd::storage
