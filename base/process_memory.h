// What this process's memory is made of, as the kernel and glibc's malloc
// see it: the figures `/metrics` exports so an operator can tell the
// configured budgets (K/V pool, DRAM tier, memtables) from allocator
// retention.
//
// glibc keeps freed memory in its arenas (one per thread that allocated, up
// to 8 x cores) instead of returning it to the kernel; a server whose
// sessions come and go then shows an RSS well above what it uses.
// ReturnFreeHeapToOs() gives those pages back (malloc_trim).
//
//   ProcessMemory m = ReadProcessMemory();
//   if (m.heap_free_bytes > (64 << 20)) ReturnFreeHeapToOs();
//
// Thread-safety: both functions may be called from any thread.
#ifndef KVD_BASE_PROCESS_MEMORY_H_
#define KVD_BASE_PROCESS_MEMORY_H_

#include <cstdint>

namespace kvd {

struct ProcessMemory {
  int64_t rss_bytes = 0;       // resident now (VmRSS); -1 if unreadable
  int64_t peak_rss_bytes = 0;  // high-water mark (VmHWM); -1 if unreadable
  // malloc's view (mallinfo2): bytes handed out to the program (small-chunk
  // arenas plus mmap'd large blocks), and bytes it holds free in its arenas
  // (resident or not) that a trim could return.
  int64_t heap_in_use_bytes = 0;
  int64_t heap_free_bytes = 0;
  int64_t heap_mmap_bytes = 0;  // the large blocks among heap_in_use_bytes
};

ProcessMemory ReadProcessMemory();

// Whether malloc is glibc's. Under AddressSanitizer (bazel test
// --config=asan) it is the sanitizer's: mallinfo2 reads zeros and freed
// memory waits in its quarantine, so there is nothing for malloc_trim to
// return. Tests of the heap figures check this first.
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kGlibcMalloc = false;
#else
inline constexpr bool kGlibcMalloc = true;
#endif

// Returns free arena pages to the kernel (malloc_trim(0)); true if any
// memory was released. Costs a walk over the arenas: call it every few
// seconds at most, not per request.
bool ReturnFreeHeapToOs();

}  // namespace kvd

#endif  // KVD_BASE_PROCESS_MEMORY_H_
