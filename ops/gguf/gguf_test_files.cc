#include "ops/gguf/gguf_test_files.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace kvd::ops::testing {
namespace {

constexpr uint32_t kF32 = 0, kQ4_0 = 2, kQ8_0 = 8;
constexpr uint32_t kTU8 = 0, kTI32 = 5, kTBool = 7, kTString = 8, kTArray = 9,
                   kTU64 = 10;
constexpr uint64_t k2p63 = uint64_t{1} << 63;

// Header + metadata "general.architecture" = "tiny" followed by `more_kvs` more
// entries.
RawGguf Start(uint64_t n_tensors, uint64_t more_kvs) {
  RawGguf g;
  g.Header(3, n_tensors, 1 + more_kvs).KvString("general.architecture", "tiny");
  return g;
}

// Pads to 32 and appends `data_bytes` bytes of tensor data.
std::string Finish(RawGguf g, size_t data_bytes) {
  g.PadTo(32);
  return g.bytes() + std::string(data_bytes, '\x11');
}

// One F32 tensor "w" with the given dims/type/offset and enough data for 8
// floats.
std::string OneTensor(const std::vector<uint64_t>& dims, uint32_t type,
                      uint64_t offset = 0) {
  RawGguf g = Start(1, 0);
  g.TensorInfo("w", dims, type, offset);
  return Finish(g, 32);
}

}  // namespace

RawGguf& RawGguf::U8(uint8_t v) {
  bytes_.push_back(static_cast<char>(v));
  return *this;
}
RawGguf& RawGguf::U32(uint32_t v) {
  char b[4];
  std::memcpy(b, &v, 4);
  bytes_.append(b, 4);
  return *this;
}
RawGguf& RawGguf::U64(uint64_t v) {
  char b[8];
  std::memcpy(b, &v, 8);
  bytes_.append(b, 8);
  return *this;
}
RawGguf& RawGguf::Str(std::string_view s) {
  U64(s.size());
  bytes_.append(s.data(), s.size());
  return *this;
}
RawGguf& RawGguf::Raw(std::string_view b) {
  bytes_.append(b.data(), b.size());
  return *this;
}
RawGguf& RawGguf::Header(uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
  return Raw("GGUF").U32(version).U64(n_tensors).U64(n_kv);
}
RawGguf& RawGguf::KvU32(std::string_view key, uint32_t v) {
  return Str(key).U32(4).U32(v);
}
RawGguf& RawGguf::KvString(std::string_view key, std::string_view v) {
  return Str(key).U32(kTString).Str(v);
}
RawGguf& RawGguf::TensorInfo(std::string_view name,
                             const std::vector<uint64_t>& dims, uint32_t type,
                             uint64_t offset) {
  Str(name).U32(static_cast<uint32_t>(dims.size()));
  for (uint64_t d : dims) U64(d);
  return U32(type).U64(offset);
}
RawGguf& RawGguf::PadTo(uint64_t alignment) {
  while (bytes_.size() % alignment != 0) bytes_.push_back('\0');
  return *this;
}

std::string SmallValidGguf() {
  RawGguf g;
  g.Header(3, 2, 3)
      .KvString("general.architecture", "tiny")
      .KvU32("general.alignment", 32)
      .KvU32("tiny.block_count", 1)
      .TensorInfo("w", {8}, kF32, 0)
      .TensorInfo("v", {32, 2}, kQ8_0, 32)
      .PadTo(32);
  std::string data(32 + 68, '\0');
  const float w[8] = {1, -2, 0.5f, 3, 0, -0.25f, 8, 1e-3f};
  std::memcpy(&data[0], w, sizeof(w));
  for (int b = 0; b < 2; ++b) {
    const uint16_t d = 0x3c00;  // fp16 1.0
    std::memcpy(&data[32 + 34 * b], &d, 2);
    for (int j = 0; j < 32; ++j)
      data[32 + 34 * b + 2 + j] = static_cast<char>(j - 16 + b);
  }
  return g.bytes() + data;
}

std::vector<HostileFile> HostileGgufFiles() {
  std::vector<HostileFile> c;
  auto add = [&c](std::string name, std::string bytes, std::string want) {
    c.push_back({std::move(name), std::move(bytes), std::move(want)});
  };
  const std::string valid = SmallValidGguf();

  // Header.
  add("empty", "", "too small");
  add("bad_magic", "GGUX" + valid.substr(4), "bad magic");
  add("truncated_header", valid.substr(0, 12),
      "truncated: tensor count needs 8 bytes");
  add("version1", RawGguf().Header(1, 0, 0).bytes(),
      "version 1 is not supported");
  add("version99", RawGguf().Header(99, 0, 0).bytes(),
      "unsupported GGUF version 99");
  add("big_endian", RawGguf().Header(0x03000000, 0, 0).bytes(), "big-endian");
  add("huge_n_kv", RawGguf().Header(3, 0, uint64_t{1} << 60).bytes(),
      "metadata count");
  add("huge_n_tensors",
      RawGguf().Header(3, uint64_t{1} << 60, 0).U64(0).bytes(),
      "tensor count 1152921504606846976 cannot fit");

  // Metadata.
  add("huge_key_length",
      RawGguf().Header(3, 0, 1).U64(k2p63).Raw("abcdefghijkl").bytes(),
      "metadata key #0 at offset 24 has length 9223372036854775808");
  add("huge_string_value",
      RawGguf()
          .Header(3, 0, 1)
          .Str("k")
          .U32(kTString)
          .U64(~uint64_t{0})
          .Raw("xyz")
          .bytes(),
      "metadata key 'k' at offset 37 has length 18446744073709551615, past the "
      "end");
  add("huge_string_array",
      RawGguf()
          .Header(3, 0, 1)
          .Str("k")
          .U32(kTArray)
          .U32(kTString)
          .U64(uint64_t{1} << 61)
          .bytes(),
      "array of 2305843009213693952 strings at offset 41 cannot fit");
  add("huge_numeric_array",
      RawGguf()
          .Header(3, 0, 1)
          .Str("k")
          .U32(kTArray)
          .U32(kTU64)
          .U64(uint64_t{1} << 61)
          .U64(0)
          .bytes(),
      "array of 2305843009213693952 uint64 values at offset 41 runs past the "
      "end");
  add("string_array_element_past_end",
      RawGguf()
          .Header(3, 0, 1)
          .Str("k")
          .U32(kTArray)
          .U32(kTString)
          .U64(2)
          .Str("a")
          .U64(1000)
          .Raw("b")
          .bytes(),
      "has length 1000, past the end");
  add("unknown_value_type",
      RawGguf().Header(3, 0, 1).Str("k").U32(13).U32(0).bytes(),
      "metadata key 'k' has unknown value type 13");
  add("unknown_array_element_type",
      RawGguf().Header(3, 0, 1).Str("k").U32(kTArray).U32(99).U64(0).bytes(),
      "array element has unknown value type 99");
  add("nested_array",
      RawGguf()
          .Header(3, 0, 1)
          .Str("k")
          .U32(kTArray)
          .U32(kTArray)
          .U64(1)
          .U32(kTU8)
          .U64(1)
          .U8(0)
          .bytes(),
      "metadata key 'k': nested arrays are not supported");
  add("bad_bool", RawGguf().Header(3, 0, 1).Str("k").U32(kTBool).U8(2).bytes(),
      "bool value 2 is neither 0 nor 1");
  add("bad_bool_array",
      RawGguf()
          .Header(3, 0, 1)
          .Str("k")
          .U32(kTArray)
          .U32(kTBool)
          .U64(3)
          .U8(1)
          .U8(0)
          .U8(7)
          .bytes(),
      "bool array element 2 is 7");
  add("empty_key", RawGguf().Header(3, 0, 1).Str("").U32(kTU8).U8(0).bytes(),
      "metadata key #0 at offset 24 is empty");
  add("duplicate_key",
      RawGguf().Header(3, 0, 2).KvU32("a", 1).KvU32("a", 2).bytes(),
      "duplicate metadata key 'a' (entries #0 and #1)");
  add("truncated_value",
      RawGguf().Header(3, 0, 1).Str("k").U32(kTU64).U32(0).bytes(),
      "truncated: metadata key 'k' needs 8 bytes at offset 37");

  // Alignment.
  {
    RawGguf g = Start(1, 1);
    g.KvU32("general.alignment", 33).TensorInfo("w", {8}, kF32, 0);
    add("alignment_not_power_of_two", Finish(g, 32),
        "general.alignment 33 is not a power of two");
  }
  {
    RawGguf g = Start(0, 1);
    g.KvU32("general.alignment", 0);
    add("alignment_zero", g.bytes(),
        "general.alignment 0 is not a power of two");
  }
  {
    RawGguf g = Start(0, 1);
    g.KvString("general.alignment", "32");
    add("alignment_string", g.bytes(), "general.alignment has type string");
  }
  {
    RawGguf g = Start(0, 1);
    g.Str("general.alignment").U32(kTI32).U32(static_cast<uint32_t>(-32));
    add("alignment_negative", g.bytes(), "general.alignment has type int32");
  }
  {
    RawGguf g = Start(1, 1);
    g.Str("general.alignment")
        .U32(kTU64)
        .U64(k2p63)
        .TensorInfo("w", {8}, kF32, 0);
    add("alignment_2_pow_63", Finish(g, 32),
        "tensor 'w' data [9223372036854775808, 9223372036854775840) runs past "
        "end of file");
  }

  // Tensor infos.
  {
    RawGguf g = Start(2, 0);
    g.TensorInfo("w", {8}, kF32, 0).TensorInfo("w", {8}, kF32, 32);
    add("duplicate_tensor", Finish(g, 64),
        "duplicate tensor name 'w' (tensors #0 and #1)");
  }
  {
    RawGguf g = Start(1, 0);
    g.TensorInfo("", {8}, kF32, 0);
    add("empty_tensor_name", Finish(g, 32), "tensor #0 has an empty name");
  }
  add("unknown_tensor_type", OneTensor({8}, 99),
      "tensor 'w' has unknown GGML type id 99");
  add("retired_tensor_type", OneTensor({32}, 4),
      "tensor 'w' has unknown GGML type id 4");
  add("zero_dim", OneTensor({8, 0}, kF32), "tensor 'w' dimension 1 is 0");
  add("no_dims", OneTensor({}, kF32), "tensor 'w' has 0 dimensions");
  add("five_dims", OneTensor({1, 1, 1, 1, 8}, kF32),
      "tensor 'w' has 5 dimensions");
  add("dim_above_int64", OneTensor({k2p63}, kF32),
      "tensor 'w' dimension 0 is 9223372036854775808");
  add("dims_product_overflow",
      OneTensor({uint64_t{1} << 62, uint64_t{1} << 62}, kF32),
      "tensor 'w' element count overflows int64 at dimension 1");
  add("size_overflow", OneTensor({uint64_t{1} << 62}, kF32),
      "more than 2^64 bytes");
  add("row_not_block_multiple", OneTensor({33}, kQ4_0),
      "tensor 'w' row length 33 is not a multiple of the Q4_0 block size 32");
  add("misaligned_offset", OneTensor({4}, kF32, 16),
      "tensor 'w' data offset 16 is not a multiple of the alignment 32");
  add("offset_overflow", OneTensor({8}, kF32, ~uint64_t{31}), "overflows");
  add("tensor_past_eof", OneTensor({16}, kF32),
      "tensor 'w' data [128, 192) runs past end of file (160 bytes)");
  {
    RawGguf g = Start(2, 0);
    g.TensorInfo("a", {16}, kF32, 0).TensorInfo("b", {8}, kF32, 32);
    add("overlapping_tensors", Finish(g, 96),
        "tensors 'a' data [160, 224) and 'b' data [192, 224) overlap");
  }
  {
    RawGguf g = Start(1, 0);
    // Cut inside the tensor info; the long name leaves enough bytes to pass the
    // count cap.
    const std::string name(40, 'w');
    g.Str(name).U32(1).U64(8);
    add("truncated_tensor_info", g.bytes(),
        "truncated: tensor '" + name + "' type needs 4");
  }
  return c;
}

}  // namespace kvd::ops::testing
