// The figures must move the way the allocations do: these checks compare
// readings of one run against each other (no absolute thresholds, which
// depend on the machine and the test runner).
#include "base/process_memory.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "gtest/gtest.h"

namespace kvd {
namespace {

constexpr int64_t kMiB = 1 << 20;

// 64 MiB in 4 KiB pieces: small enough to come from malloc's arenas, not
// from their own mmap, so freeing them leaves free arena memory behind.
std::vector<std::unique_ptr<char[]>> AllocateSmallPieces() {
  std::vector<std::unique_ptr<char[]>> pieces;
  for (int i = 0; i < 64 * 256; ++i) {
    pieces.emplace_back(new char[4096]);
    std::memset(pieces.back().get(), i & 0xff, 4096);  // make it resident
  }
  return pieces;
}

TEST(ProcessMemoryTest, ReadsKernelFigures) {
  const ProcessMemory m = ReadProcessMemory();
  EXPECT_GT(m.rss_bytes, 0);
  EXPECT_GE(m.peak_rss_bytes, m.rss_bytes);
}

TEST(ProcessMemoryTest, HeapInUseFollowsAllocations) {
  if (!kGlibcMalloc) GTEST_SKIP() << "malloc is AddressSanitizer's";
  const ProcessMemory before = ReadProcessMemory();
  auto pieces = AllocateSmallPieces();
  const ProcessMemory during = ReadProcessMemory();
  EXPECT_GE(during.heap_in_use_bytes - before.heap_in_use_bytes, 64 * kMiB);
  EXPECT_GE(during.rss_bytes - before.rss_bytes, 48 * kMiB);

  // Free all but the last piece: it pins the arena's top, so glibc cannot
  // shrink the heap by itself and the freed memory stays resident.
  auto last = std::move(pieces.back());
  pieces.clear();
  const ProcessMemory freed = ReadProcessMemory();
  EXPECT_LE(freed.heap_in_use_bytes, during.heap_in_use_bytes - 60 * kMiB);
  EXPECT_GE(freed.heap_free_bytes - before.heap_free_bytes, 60 * kMiB);
  EXPECT_GE(freed.rss_bytes - before.rss_bytes, 48 * kMiB)
      << "glibc returned the freed pieces by itself; this test's premise "
         "(arena retention) no longer holds";

  EXPECT_TRUE(ReturnFreeHeapToOs());
  const ProcessMemory trimmed = ReadProcessMemory();
  EXPECT_LE(trimmed.rss_bytes, freed.rss_bytes - 48 * kMiB);
}

}  // namespace
}  // namespace kvd
