#include "kernels/quant/ggml_type.h"

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace kvd::kernels {
namespace {

struct TypeTraits {
  GgmlType type;
  const char* name;
  int64_t block_size;
  int64_t block_bytes;
  bool dequantize_supported;
};

constexpr int64_t kQK_K = 256;

// GGML's type_traits (ggml.c) / gguf-py GGML_QUANT_SIZES.
constexpr TypeTraits kTraits[] = {
    {GgmlType::kF32, "F32", 1, 4, true},
    {GgmlType::kF16, "F16", 1, 2, true},
    {GgmlType::kQ4_0, "Q4_0", 32, 2 + 16, true},
    {GgmlType::kQ4_1, "Q4_1", 32, 2 + 2 + 16, true},
    {GgmlType::kQ5_0, "Q5_0", 32, 2 + 4 + 16, true},
    {GgmlType::kQ5_1, "Q5_1", 32, 2 + 2 + 4 + 16, true},
    {GgmlType::kQ8_0, "Q8_0", 32, 2 + 32, true},
    {GgmlType::kQ8_1, "Q8_1", 32, 4 + 4 + 32, false},
    {GgmlType::kQ2_K, "Q2_K", kQK_K, 2 + 2 + kQK_K / 16 + kQK_K / 4, false},
    {GgmlType::kQ3_K, "Q3_K", kQK_K, 2 + kQK_K / 4 + kQK_K / 8 + 12, false},
    {GgmlType::kQ4_K, "Q4_K", kQK_K, 2 + 2 + kQK_K / 2 + 12, true},
    {GgmlType::kQ5_K, "Q5_K", kQK_K, 2 + 2 + kQK_K / 2 + kQK_K / 8 + 12, true},
    {GgmlType::kQ6_K, "Q6_K", kQK_K, 2 + kQK_K / 2 + kQK_K / 4 + kQK_K / 16,
     true},
    {GgmlType::kQ8_K, "Q8_K", kQK_K, 4 + kQK_K + kQK_K / 8, false},
    {GgmlType::kIQ2_XXS, "IQ2_XXS", kQK_K, 2 + kQK_K / 4, false},
    {GgmlType::kIQ2_XS, "IQ2_XS", kQK_K, 2 + kQK_K / 4 + kQK_K / 32, false},
    {GgmlType::kIQ3_XXS, "IQ3_XXS", kQK_K, 2 + kQK_K / 4 + kQK_K / 8, false},
    {GgmlType::kIQ1_S, "IQ1_S", kQK_K, 2 + kQK_K / 8 + kQK_K / 16, false},
    {GgmlType::kIQ4_NL, "IQ4_NL", 32, 2 + 16, false},
    {GgmlType::kIQ3_S, "IQ3_S", kQK_K,
     2 + kQK_K / 4 + kQK_K / 8 + kQK_K / 32 + 4, false},
    {GgmlType::kIQ2_S, "IQ2_S", kQK_K, 2 + kQK_K / 4 + kQK_K / 16, false},
    {GgmlType::kIQ4_XS, "IQ4_XS", kQK_K, 2 + 2 + kQK_K / 2 + kQK_K / 64, false},
    {GgmlType::kI8, "I8", 1, 1, false},
    {GgmlType::kI16, "I16", 1, 2, false},
    {GgmlType::kI32, "I32", 1, 4, false},
    {GgmlType::kI64, "I64", 1, 8, false},
    {GgmlType::kF64, "F64", 1, 8, false},
    {GgmlType::kIQ1_M, "IQ1_M", kQK_K, kQK_K / 8 + kQK_K / 16 + kQK_K / 32,
     false},
    {GgmlType::kBF16, "BF16", 1, 2, true},
    {GgmlType::kTQ1_0, "TQ1_0", kQK_K, 2 + 4 * 13, false},
    {GgmlType::kTQ2_0, "TQ2_0", kQK_K, 2 + 64, false},
    {GgmlType::kMXFP4, "MXFP4", 32, 1 + 16, false},
    {GgmlType::kNVFP4, "NVFP4", 64, 4 + 32, false},
    {GgmlType::kQ1_0, "Q1_0", 128, 2 + 16, false},
};

const TypeTraits* FindTraits(uint32_t id) {
  for (const TypeTraits& t : kTraits) {
    if (static_cast<uint32_t>(t.type) == id) return &t;
  }
  return nullptr;
}

const TypeTraits* FindTraits(GgmlType type) {
  return FindTraits(static_cast<uint32_t>(type));
}

}  // namespace

bool IsKnownGgmlType(uint32_t id) { return FindTraits(id) != nullptr; }

absl::StatusOr<GgmlType> GgmlTypeFromId(uint32_t id) {
  if (FindTraits(id) == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown GGML tensor type id ", id,
                     " (known ids: 0-3, 6-30, 34, 35, 39-41)"));
  }
  return static_cast<GgmlType>(id);
}

std::string_view GgmlTypeName(GgmlType type) {
  const TypeTraits* t = FindTraits(type);
  return t == nullptr ? "unknown" : t->name;
}

absl::StatusOr<GgmlType> GgmlTypeFromName(std::string_view name) {
  for (const TypeTraits& t : kTraits) {
    if (t.name == name) return t.type;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown GGML type name '", std::string(name), "'"));
}

int64_t BlockSize(GgmlType type) {
  const TypeTraits* t = FindTraits(type);
  return t == nullptr ? 0 : t->block_size;
}

int64_t BlockBytes(GgmlType type) {
  const TypeTraits* t = FindTraits(type);
  return t == nullptr ? 0 : t->block_bytes;
}

absl::StatusOr<uint64_t> RowBytes(GgmlType type, int64_t n_elements) {
  const TypeTraits* t = FindTraits(type);
  if (t == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown GGML tensor type id ", static_cast<uint32_t>(type)));
  }
  if (n_elements < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "negative element count ", n_elements, " for type ", t->name));
  }
  if (n_elements % t->block_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("element count ", n_elements, " is not a multiple of the ",
                     t->name, " block size ", t->block_size));
  }
  const uint64_t blocks = static_cast<uint64_t>(n_elements / t->block_size);
  uint64_t bytes;
  if (__builtin_mul_overflow(blocks, static_cast<uint64_t>(t->block_bytes),
                             &bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat(n_elements, " elements of type ", t->name,
                     " take more than 2^64 bytes"));
  }
  return bytes;
}

bool IsDequantizeSupported(GgmlType type) {
  const TypeTraits* t = FindTraits(type);
  return t != nullptr && t->dequantize_supported;
}

}  // namespace kvd::kernels
