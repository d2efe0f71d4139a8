// Builds GGUF (version 3) files: metadata of every value type plus tensors,
// written to a file or a string. Used by tests and to make tiny random-weight
// models; not tuned for multi-GB outputs (tensor bytes are held in memory until
// written).
//
// Errors (a duplicate key or tensor name, a tensor whose data does not match
// its dims, a bad alignment) do not abort the Add* call chain: the first one is
// kept and returned by status(), WriteToString() and WriteToFile(), so building
// code stays linear.
//
// Thread-safety: not thread-safe; use one writer per thread.
//
//   GgufWriter w;
//   w.AddString("general.architecture", "llama");
//   w.AddUint32("llama.block_count", 2);
//   w.AddStringArray("tokenizer.ggml.tokens", {"<s>", "</s>", "a"});
//   w.AddTensorF32("output_norm.weight", {64}, norm_weights);
//   w.AddTensorRaw("blk.0.attn_q.weight", kernels::GgmlType::kQ8_0,
//                  {64, 64}, q8_bytes);
//   KVD_RETURN_IF_ERROR(w.WriteToFile(path));
#ifndef KVD_OPS_GGUF_GGUF_WRITER_H_
#define KVD_OPS_GGUF_GGUF_WRITER_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/quant/ggml_type.h"
#include "ops/gguf/gguf_file.h"

namespace kvd::ops {

class GgufWriter {
 public:
  // `alignment` of the tensor data (a power of two); written as
  // general.alignment when it is not GGUF's default of 32.
  explicit GgufWriter(uint64_t alignment = 32);

  // Scalars. Keys are written in the order they are added and must be unique.
  void AddUint8(std::string_view key, uint8_t v);
  void AddInt8(std::string_view key, int8_t v);
  void AddUint16(std::string_view key, uint16_t v);
  void AddInt16(std::string_view key, int16_t v);
  void AddUint32(std::string_view key, uint32_t v);
  void AddInt32(std::string_view key, int32_t v);
  void AddFloat32(std::string_view key, float v);
  void AddBool(std::string_view key, bool v);
  void AddString(std::string_view key, std::string_view v);
  void AddUint64(std::string_view key, uint64_t v);
  void AddInt64(std::string_view key, int64_t v);
  void AddFloat64(std::string_view key, double v);

  // Arrays. AddArray takes any numeric element type (uint8_t ... double; bool
  // via AddBoolArray).
  void AddStringArray(std::string_view key,
                      absl::Span<const std::string> values);
  void AddStringArray(std::string_view key,
                      absl::Span<const std::string_view> values);
  void AddStringArray(std::string_view key,
                      std::initializer_list<std::string_view> values) {
    AddStringArray(
        key, absl::Span<const std::string_view>(values.begin(), values.size()));
  }
  void AddBoolArray(std::string_view key, const std::vector<bool>& values);
  template <typename T>
  void AddArray(std::string_view key, absl::Span<const T> values) {
    AddArrayRaw(key, ValueTypeOf<T>(), values.data(), values.size(), sizeof(T));
  }
  void AddFloat32Array(std::string_view key, absl::Span<const float> values) {
    AddArray<float>(key, values);
  }
  void AddInt32Array(std::string_view key, absl::Span<const int32_t> values) {
    AddArray<int32_t>(key, values);
  }

  // Tensors, in the order added. `dims` follows GGML (dims[0] is the row
  // length); `values` holds the product of dims elements, row-major. F16/BF16
  // round to nearest even.
  void AddTensorF32(std::string_view name, std::vector<int64_t> dims,
                    absl::Span<const float> values);
  void AddTensorF16(std::string_view name, std::vector<int64_t> dims,
                    absl::Span<const float> values);
  void AddTensorBF16(std::string_view name, std::vector<int64_t> dims,
                     absl::Span<const float> values);
  // Pre-encoded data of any GGML type; `bytes` must be exactly RowBytes(type,
  // elements).
  void AddTensorRaw(std::string_view name, kernels::GgmlType type,
                    std::vector<int64_t> dims, absl::Span<const uint8_t> bytes);

  // The first error from an Add* call, or OK.
  const absl::Status& status() const { return status_; }

  absl::StatusOr<std::string> WriteToString() const;
  // Writes `path` via a temporary file renamed into place.
  absl::Status WriteToFile(const std::string& path) const;

 private:
  struct Tensor {
    std::string name;
    kernels::GgmlType type;
    std::vector<int64_t> dims;
    std::string bytes;
  };

  template <typename T>
  static constexpr GgufValueType ValueTypeOf() {
    static_assert(std::is_arithmetic_v<T> && !std::is_same_v<T, bool>,
                  "AddArray takes numeric element types; use "
                  "AddBoolArray/AddStringArray");
    if constexpr (std::is_same_v<T, uint8_t>) return GgufValueType::kUint8;
    if constexpr (std::is_same_v<T, int8_t>) return GgufValueType::kInt8;
    if constexpr (std::is_same_v<T, uint16_t>) return GgufValueType::kUint16;
    if constexpr (std::is_same_v<T, int16_t>) return GgufValueType::kInt16;
    if constexpr (std::is_same_v<T, uint32_t>) return GgufValueType::kUint32;
    if constexpr (std::is_same_v<T, int32_t>) return GgufValueType::kInt32;
    if constexpr (std::is_same_v<T, float>) return GgufValueType::kFloat32;
    if constexpr (std::is_same_v<T, uint64_t>) return GgufValueType::kUint64;
    if constexpr (std::is_same_v<T, int64_t>) return GgufValueType::kInt64;
    if constexpr (std::is_same_v<T, double>) return GgufValueType::kFloat64;
  }

  bool StartKey(std::string_view key, GgufValueType type);
  void AddScalar(std::string_view key, GgufValueType type, const void* v,
                 size_t size);
  void AddArrayRaw(std::string_view key, GgufValueType elem, const void* data,
                   uint64_t count, size_t elem_size);
  void AddTensor(std::string_view name, kernels::GgmlType type,
                 std::vector<int64_t> dims, std::string bytes);
  // Element count of `dims`, or an error recorded in status_ (returns -1).
  int64_t CheckDims(std::string_view name, const std::vector<int64_t>& dims);
  void Fail(absl::Status s);

  uint64_t alignment_;
  absl::Status status_;
  uint64_t n_kv_ = 0;
  std::string kv_bytes_;
  absl::flat_hash_set<std::string> keys_;
  std::vector<Tensor> tensors_;
  absl::flat_hash_set<std::string> tensor_names_;
};

}  // namespace kvd::ops

#endif  // KVD_OPS_GGUF_GGUF_WRITER_H_
