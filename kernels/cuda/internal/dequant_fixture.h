// Reads the dequantization fixture that tools/gpu/make_dequant_fixture.py cuts
// from the project's GGUF models (real tensors' raw bytes), for
// dequant_test.cc and dequant_element_test.cc. Test-only.
#ifndef KVD_KERNELS_CUDA_INTERNAL_DEQUANT_FIXTURE_H_
#define KVD_KERNELS_CUDA_INTERNAL_DEQUANT_FIXTURE_H_

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/quant/ggml_type.h"

namespace kvd::kernels::cuda::testing {

struct FixtureTensor {
  std::string name;
  GgmlType type;
  int64_t rows, cols;
  std::vector<uint8_t> bytes;
};

// Reads make_dequant_fixture.py's format; empty on any error (reported).
inline std::vector<FixtureTensor> ReadDequantFixture(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::vector<FixtureTensor> out;
  char magic[8];
  uint32_t count = 0;
  if (!f.read(magic, 8) || std::memcmp(magic, "KVDQFIX1", 8) != 0 ||
      !f.read(reinterpret_cast<char*>(&count), 4)) {
    ADD_FAILURE() << path << ": not a dequant fixture";
    return {};
  }
  for (uint32_t i = 0; i < count; ++i) {
    uint32_t len = 0, type = 0;
    int64_t rows = 0, cols = 0;
    uint64_t nbytes = 0;
    FixtureTensor t;
    if (!f.read(reinterpret_cast<char*>(&len), 4) || len > 4096) break;
    t.name.resize(len);
    if (!f.read(t.name.data(), len) ||
        !f.read(reinterpret_cast<char*>(&type), 4) ||
        !f.read(reinterpret_cast<char*>(&rows), 8) ||
        !f.read(reinterpret_cast<char*>(&cols), 8) ||
        !f.read(reinterpret_cast<char*>(&nbytes), 8) || nbytes > (1u << 30))
      break;
    t.bytes.resize(nbytes);
    if (!f.read(reinterpret_cast<char*>(t.bytes.data()), nbytes)) break;
    t.type = static_cast<GgmlType>(type);
    t.rows = rows;
    t.cols = cols;
    out.push_back(std::move(t));
  }
  if (out.size() != count) {
    ADD_FAILURE() << path << ": truncated after " << out.size() << " of "
                  << count << " tensors";
  }
  return out;
}

}  // namespace kvd::kernels::cuda::testing

#endif  // KVD_KERNELS_CUDA_INTERNAL_DEQUANT_FIXTURE_H_
