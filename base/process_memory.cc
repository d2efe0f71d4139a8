#include "base/process_memory.h"

#include <malloc.h>

#include <cstdio>
#include <cstring>

namespace kvd {
namespace {

// "VmRSS:    123456 kB" -> bytes, for the line starting with `key`.
int64_t StatusKilobytes(const char* key) {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return -1;
  char line[256];
  int64_t bytes = -1;
  const size_t key_len = std::strlen(key);
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    if (std::strncmp(line, key, key_len) != 0) continue;
    long long kb = 0;
    if (std::sscanf(line + key_len, " %lld", &kb) == 1) bytes = kb * 1024;
    break;
  }
  std::fclose(f);
  return bytes;
}

}  // namespace

ProcessMemory ReadProcessMemory() {
  ProcessMemory m;
  m.rss_bytes = StatusKilobytes("VmRSS:");
  m.peak_rss_bytes = StatusKilobytes("VmHWM:");
  const struct mallinfo2 info = mallinfo2();
  m.heap_in_use_bytes = static_cast<int64_t>(info.uordblks + info.hblkhd);
  m.heap_free_bytes = static_cast<int64_t>(info.fordblks);
  m.heap_mmap_bytes = static_cast<int64_t>(info.hblkhd);
  return m;
}

bool ReturnFreeHeapToOs() { return malloc_trim(0) != 0; }

}  // namespace kvd
