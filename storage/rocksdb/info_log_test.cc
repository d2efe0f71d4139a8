// The RocksDB LOG writer never aborts and never blocks the database: lines go
// to the file with RocksDB's prefix, later runs append, a full device
// (/dev/full) drops lines and counts them, and at the size cap LOG moves to
// LOG.old and a new LOG starts.
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

TEST(InfoLogFile, WritesPrefixedLinesAndLaterRunsAppend) {
  const std::string file = TestDir("append") + "/LOG";
  {
    InfoLogFile log(file);
    rocksdb::Info(&log, "first run, table #%d", 7);
    EXPECT_EQ(log.lines_written(), 1);
  }
  EXPECT_THAT(ReadFile(file),
              MatchesRegex("[0-9/]+-[0-9:.]+ [0-9a-f]+ .*first run, table "
                           "#7\n"));
  InfoLogFile log(file);
  rocksdb::Warn(&log, "second run");
  const std::string text = ReadFile(file);
  EXPECT_THAT(text, HasSubstr("first run"));
  EXPECT_LT(text.find("first run"), text.find("second run"));
  EXPECT_FALSE(std::filesystem::exists(file + ".old"));
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

TEST(InfoLogFile, MovesToLogOldAtTheSizeCap) {
  const std::string file = TestDir("cap") + "/LOG";
  InfoLogFile log(file, /*max_bytes=*/1000);
  for (int i = 0; i < 100; ++i) {
    rocksdb::Info(&log, "line %03d %s", i, std::string(80, 'x').c_str());
  }
  EXPECT_EQ(log.lines_written(), 100);
  EXPECT_EQ(log.lines_dropped(), 0);
  const std::string current = ReadFile(file);
  const std::string old = ReadFile(file + ".old");
  EXPECT_THAT(current, HasSubstr("line 099"));
  EXPECT_THAT(old, Not(HasSubstr("line 099")));
  EXPECT_THAT(old, HasSubstr("line 0"));
  // At most one line past the cap in each file.
  EXPECT_LT(current.size(), 1000u + 200u);
  EXPECT_LT(old.size(), 1000u + 200u);
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
