// libFuzzer entry point: parse arbitrary bytes as GGUF; when they parse, touch
// every metadata value through the typed getters and dequantize the first row
// of every tensor of a supported type, so a parser that accepted inconsistent
// sizes would be caught by ASan.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "kernels/quant/dequant.h"
#include "kernels/quant/ggml_type.h"
#include "ops/gguf/gguf_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using kvd::ops::GgufFile;
  auto parsed = GgufFile::Parse("fuzz.gguf", data, size);
  if (!parsed.ok()) return 0;
  const GgufFile& f = **parsed;
  size_t sink = f.architecture().size();
  for (const auto& [key, value] : f.metadata()) {
    sink += key.size() + value.TypeDescription().size();
    (void)f.GetString(key);
    (void)f.GetUint64(key);
    (void)f.GetInt64(key);
    (void)f.GetFloat(key);
    (void)f.GetBool(key);
    (void)f.GetFloatArray(key);
    (void)f.GetInt32Array(key);
    auto strs = f.GetStringArray(key);
    if (strs.ok()) {
      for (std::string_view s : *strs)
        sink += s.empty() ? 0 : static_cast<uint8_t>(s.back());
    }
    for (uint64_t i = 0; i < value.array_size() && i < 64; ++i) {
      sink += value.ArrayUint64(i) +
              static_cast<uint64_t>(value.ArrayInt64(i)) +
              static_cast<uint64_t>(value.ArrayDouble(i) != 0);
    }
  }
  std::vector<float> row;
  for (const auto& t : f.tensors()) {
    if (f.FindTensor(t.name) != &t) __builtin_trap();
    if (!kvd::kernels::IsDequantizeSupported(t.type)) continue;
    const int64_t n = t.row_length();
    // Keep iterations fast; sizes were already checked by the parser.
    if (n > (int64_t{1} << 20)) continue;
    row.resize(n);
    const absl::Status s = kvd::kernels::DequantizeRow(
        t.type, t.data, t.row_bytes(), row.data(), n);
    // The parser promised row_bytes() readable bytes of a valid row.
    if (!s.ok()) __builtin_trap();
  }
  return sink == 0xdeadbeef ? 1 : 0;
}
