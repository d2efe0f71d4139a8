#include "base/process_memory.h"

#include <malloc.h>

#include <cstdio>

namespace kvd {
namespace {

// VmRSS and VmHWM from one read of /proc/self/status ("VmRSS:  123 kB"),
// in bytes; -1 where unreadable.
void ReadStatus(ProcessMemory& m) {
  m.rss_bytes = m.peak_rss_bytes = -1;
  FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return;
  char line[256];
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    long long kb = 0;
    if (std::sscanf(line, "VmRSS: %lld", &kb) == 1) m.rss_bytes = kb * 1024;
    if (std::sscanf(line, "VmHWM: %lld", &kb) == 1) {
      m.peak_rss_bytes = kb * 1024;
    }
  }
  std::fclose(f);
}

}  // namespace

ProcessMemory ReadProcessMemory() {
  ProcessMemory m;
  ReadStatus(m);
  const struct mallinfo2 info = mallinfo2();
  m.heap_in_use_bytes = static_cast<int64_t>(info.uordblks + info.hblkhd);
  m.heap_free_bytes = static_cast<int64_t>(info.fordblks);
  m.heap_mmap_bytes = static_cast<int64_t>(info.hblkhd);
  return m;
}

bool ReturnFreeHeapToOs() { return malloc_trim(0) != 0; }

}  // namespace kvd
