// The trimmer must give back memory a program freed but malloc kept: the
// check compares readings of one run (no absolute timing or size thresholds
// beyond the 64 MiB the test itself allocates).
#include "services/node/memory_trimmer.h"

#include <cstring>
#include <memory>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/process_memory.h"
#include "gtest/gtest.h"

namespace kvd::node {
namespace {

constexpr int64_t kMiB = 1 << 20;

TEST(MemoryTrimmerTest, ReturnsFreedArenaMemory) {
  if (!kGlibcMalloc) GTEST_SKIP() << "malloc is AddressSanitizer's";
  // An hour-long interval: only the explicit TrimOnce calls below trim.
  MemoryTrimmer trimmer({.interval = absl::Hours(1)});
  std::vector<std::unique_ptr<char[]>> pieces;
  for (int i = 0; i < 64 * 256; ++i) {  // 64 MiB in 4 KiB arena chunks
    pieces.emplace_back(new char[4096]);
    std::memset(pieces.back().get(), 1, 4096);
  }
  auto last = std::move(pieces.back());  // pins the arena top
  pieces.clear();
  const ProcessMemory freed = ReadProcessMemory();

  trimmer.TrimOnce();
  const ProcessMemory trimmed = ReadProcessMemory();
  EXPECT_EQ(trimmer.stats().trims, 1);
  EXPECT_GE(trimmer.stats().released_bytes, 48 * kMiB);
  EXPECT_LE(trimmed.rss_bytes, freed.rss_bytes - 48 * kMiB);

  // The free chunks stay in malloc's books (not resident any more), so a
  // second pass may trim again, but has next to nothing left to give back.
  const int64_t released = trimmer.stats().released_bytes;
  trimmer.TrimOnce();
  EXPECT_LT(trimmer.stats().released_bytes - released, 8 * kMiB);
}

// Frees 64 MiB in 4 KiB arena chunks that malloc keeps (the last one pins
// the arena's top, so nothing is returned by itself).
std::unique_ptr<char[]> FreeSixtyFourMiB() {
  std::vector<std::unique_ptr<char[]>> pieces;
  for (int i = 0; i < 64 * 256; ++i) {
    pieces.emplace_back(new char[4096]);
    std::memset(pieces.back().get(), 1, 4096);
  }
  auto last = std::move(pieces.back());
  pieces.clear();
  return last;
}

TEST(MemoryTrimmerTest, TheThreadTrimsEachInterval) {
  if (!kGlibcMalloc) GTEST_SKIP() << "malloc is AddressSanitizer's";
  MemoryTrimmer trimmer(
      {.interval = absl::Milliseconds(10), .min_free_bytes = kMiB});
  auto pin = FreeSixtyFourMiB();
  // No call here: only the background thread can trim.
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (trimmer.stats().trims == 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_GE(trimmer.stats().trims, 1);
  EXPECT_GE(trimmer.stats().released_bytes, 48 * kMiB);
}

TEST(MemoryTrimmerTest, NothingIsTrimmedBelowTheThreshold) {
  if (!kGlibcMalloc) GTEST_SKIP() << "malloc is AddressSanitizer's";
  MemoryTrimmer trimmer(
      {.interval = absl::Hours(1), .min_free_bytes = int64_t{1} << 40});
  auto pin = FreeSixtyFourMiB();
  trimmer.TrimOnce();
  EXPECT_EQ(trimmer.stats().trims, 0);
  EXPECT_EQ(trimmer.stats().released_bytes, 0);
}

TEST(MemoryTrimmerTest, StopsPromptlyWithALongInterval) {
  // The destructor must not wait out the interval: measured against it (a
  // sixtieth of it, so a loaded machine cannot fail this).
  const absl::Duration interval = absl::Hours(1);
  const absl::Time start = absl::Now();
  { MemoryTrimmer trimmer({.interval = interval}); }
  EXPECT_LT(absl::Now() - start, interval / 60);
}

}  // namespace
}  // namespace kvd::node
