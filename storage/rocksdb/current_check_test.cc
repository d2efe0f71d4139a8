// Which file names count as RocksDB data for the missing-CURRENT guard: only
// RocksDB's numbered tables, blob files and write-ahead logs, never its LOG,
// LOCK, IDENTITY, MANIFEST or OPTIONS files (a first open that crashed
// leaves those), nor other people's files. The guard on whole directories is
// in session_db_test (LostCurrentFileIsRefusedAndRepairable).
#include "storage/rocksdb/current_check.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvd::storage {
namespace {

TEST(IsRocksDataFile, OnlyNumberedTablesBlobsAndLogs) {
  for (const char* yes : {"000012.sst", "000003.log", "000451.blob", "7.sst"}) {
    EXPECT_TRUE(IsRocksDataFile(yes)) << yes;
  }
  for (const char* no :
       {"LOG", "LOG.old", "LOG.old.1700000000", "LOCK", "IDENTITY", "CURRENT",
        "MANIFEST-000001", "OPTIONS-000007", "000004.dbtmp", "notes.log",
        "x12.sst", ".sst", "000012.sst.bak", "000012"}) {
    EXPECT_FALSE(IsRocksDataFile(no)) << no;
  }
}

TEST(RefuseDataWithoutCurrent, CrashedFirstOpenAndMissingDirAreFine) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(tmp != nullptr ? tmp : "/tmp") + "/cc";
  std::filesystem::create_directories(dir);
  for (const char* f : {"LOCK", "LOG", "IDENTITY", "MANIFEST-000001"}) {
    std::ofstream(dir + "/" + f) << "x";
  }
  EXPECT_TRUE(RefuseDataWithoutCurrent(dir).ok());
  EXPECT_TRUE(RefuseDataWithoutCurrent(dir + "/does-not-exist").ok());
  std::ofstream(dir + "/000009.log") << "x";
  const absl::Status s = RefuseDataWithoutCurrent(dir);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("000009.log"));
  std::ofstream(dir + "/CURRENT") << "MANIFEST-000001\n";
  EXPECT_TRUE(RefuseDataWithoutCurrent(dir).ok());
}

}  // namespace
}  // namespace kvd::storage
