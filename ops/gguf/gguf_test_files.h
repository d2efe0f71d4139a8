// Hand-assembled GGUF byte strings for tests: a small valid file and a table of
// hostile files, each with the error it must produce. Built byte by byte (not
// with GgufWriter) so they can be malformed in any way. The same bytes are
// committed under ops/gguf/testdata/ as fuzzer seeds; gguf_hostile_test checks
// that the committed copies still match. To regenerate them:
//
//   bazel build //ops/gguf:gguf_hostile_test
//   export KVD_WRITE_GGUF_TESTDATA=$PWD/ops/gguf/testdata
//   bazel-bin/ops/gguf/gguf_hostile_test --gtest_filter='*CommittedTestdata*'
#ifndef KVD_OPS_GGUF_GGUF_TEST_FILES_H_
#define KVD_OPS_GGUF_GGUF_TEST_FILES_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvd::ops::testing {

// Appends little-endian fields.
class RawGguf {
 public:
  RawGguf& U8(uint8_t v);
  RawGguf& U32(uint32_t v);
  RawGguf& U64(uint64_t v);
  RawGguf& Str(std::string_view s);  // u64 length + bytes
  RawGguf& Raw(std::string_view bytes);
  RawGguf& Header(uint32_t version, uint64_t n_tensors, uint64_t n_kv);
  RawGguf& KvU32(std::string_view key, uint32_t v);
  RawGguf& KvString(std::string_view key, std::string_view v);
  // name, n_dims, dims, type, offset.
  RawGguf& TensorInfo(std::string_view name, const std::vector<uint64_t>& dims,
                      uint32_t type, uint64_t offset);
  RawGguf& PadTo(uint64_t alignment);
  const std::string& bytes() const { return bytes_; }

 private:
  std::string bytes_;
};

// A valid v3 file: 3 metadata keys (general.architecture = "tiny",
// general.alignment = 32, tiny.block_count = 1) and two tensors: "w" F32 dims
// {8} and "v" Q8_0 dims {32, 2}.
std::string SmallValidGguf();

struct HostileFile {
  std::string name;  // also the testdata file name: bad_<name>.gguf
  std::string bytes;
  std::string want;  // substring the error message must contain
};
std::vector<HostileFile> HostileGgufFiles();

}  // namespace kvd::ops::testing

#endif  // KVD_OPS_GGUF_GGUF_TEST_FILES_H_
