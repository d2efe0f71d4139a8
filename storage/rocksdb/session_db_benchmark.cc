// Residual-chunk throughput and compression of the RocksDB tier's residual
// column family (blob files), per blob compression: none, LZ4, ZSTD.
// Results and the command are in docs/BENCHMARKS.md ("Checkpoint storage").
//
//   bazel run -c opt //storage/rocksdb:session_db_benchmark -- DIR [MiB]
//
// Rows are synthetic: bf16 values of Gaussian activations whose per-channel
// scale is log-normal (a few channels much larger than the rest, as in real
// residual streams), rounded to nearest-even bf16. kvd cannot dump real
// residuals yet. Chunks are SmolLM2-135M's shape: 64 tokens x 576 x bf16.
// Writes go through the same column-family options as SessionDb (blob files,
// min blob size 4 KiB) with direct I/O for flushes, and end with a WAL sync
// and a flush, so the time includes reaching the disk. Reads are a prefix
// scan with direct reads (no page cache).
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "rocksdb/convenience.h"
#include "rocksdb/db.h"

namespace {

constexpr int kTokens = 64;
constexpr int kHidden = 576;
constexpr size_t kChunkBytes = kTokens * kHidden * 2;

uint16_t ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7FFF + ((u >> 16) & 1);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

std::vector<std::string> MakeChunks(int n) {
  std::mt19937 rng(42);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> scale(kHidden);
  for (float& s : scale) s = std::exp(normal(rng));
  std::vector<std::string> chunks(n, std::string(kChunkBytes, '\0'));
  for (std::string& c : chunks) {
    for (int i = 0; i < kTokens * kHidden; ++i) {
      const uint16_t b = ToBf16(normal(rng) * scale[i % kHidden]);
      std::memcpy(&c[2 * i], &b, 2);
    }
  }
  return chunks;
}

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
      .count();
}

int64_t BlobBytes(const std::string& dir) {
  int64_t total = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() == ".blob") total += e.file_size();
  }
  return total;
}

int Run(const std::string& root, rocksdb::CompressionType type,
        const char* name, const std::vector<std::string>& chunks) {
  const std::string dir = root + "/" + name;
  std::filesystem::remove_all(dir);
  rocksdb::Options o;
  o.create_if_missing = true;
  o.use_direct_io_for_flush_and_compaction = true;
  o.use_direct_reads = true;
  o.enable_blob_files = true;
  o.min_blob_size = 4096;
  o.blob_compression_type = type;
  o.write_buffer_size = 64 << 20;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(o, dir, &raw);
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  std::unique_ptr<rocksdb::DB> db(raw);
  const double logical = static_cast<double>(chunks.size() * kChunkBytes);
  auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < chunks.size(); ++i) {
    char key[32];
    std::snprintf(key, sizeof(key), "t/s/%016zx", i);
    s = db->Put(rocksdb::WriteOptions(), key, chunks[i]);
    if (!s.ok()) return 1;
  }
  s = db->FlushWAL(/*sync=*/true);
  if (s.ok()) s = db->Flush(rocksdb::FlushOptions());
  const double write_s = Seconds(t0);
  if (!s.ok()) return 1;
  const int64_t stored = BlobBytes(dir);

  t0 = std::chrono::steady_clock::now();
  rocksdb::ReadOptions r;
  r.fill_cache = false;
  r.readahead_size = 2 << 20;
  std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(r));
  size_t read = 0;
  for (it->Seek("t/s/"); it->Valid(); it->Next()) read += it->value().size();
  const double read_s = Seconds(t0);
  if (!it->status().ok() || read != chunks.size() * kChunkBytes) return 1;
  std::printf("| %-5s | %6.3f | %8.0f | %8.0f |\n", name, logical / stored,
              logical / write_s / 1e6, logical / read_s / 1e6);
  it.reset();
  db.reset();
  std::filesystem::remove_all(dir);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: session_db_benchmark DIR [MiB]\n");
    return 2;
  }
  const int mib = argc > 2 ? std::atoi(argv[2]) : 256;
  const int n =
      static_cast<int>((static_cast<int64_t>(mib) << 20) / kChunkBytes);
  const std::vector<std::string> chunks = MakeChunks(n);
  std::printf("%d chunks of %zu bytes (%.0f MB)\n\n", n, kChunkBytes,
              n * kChunkBytes / 1e6);
  std::printf("| blob compression | ratio | write MB/s | read MB/s |\n");
  std::printf("|---|---|---|---|\n");
  int rc = 0;
  rc |= Run(argv[1], rocksdb::kNoCompression, "none", chunks);
  rc |= Run(argv[1], rocksdb::kLZ4Compression, "lz4", chunks);
  rc |= Run(argv[1], rocksdb::kZSTD, "zstd", chunks);
  return rc;
}
