// A read-only, validated view of a GGUF model file (GGML's container: metadata
// key/values plus tensor descriptors plus aligned tensor data).
//
// Open() memory-maps the file; Parse() reads a caller-owned buffer without
// copying it. Parsing validates everything before returning, so a hostile file
// cannot crash, hang or make kvd allocate more than a small multiple of its
// size: every length is bounded by the bytes left, all size arithmetic is
// overflow-checked, duplicate keys/tensor names, unknown tensor types, bad
// dims, misaligned or overlapping tensor data and data past the end of the file
// are rejected. Errors are INVALID_ARGUMENT naming the file and the offending
// key/tensor/offset (NOT_FOUND when the file does not exist).
//
// Strings (keys, string values, string arrays such as a 262144-entry tokenizer
// vocabulary) are std::string_views into the mapped bytes: no copies, and they
// live as long as the GgufFile. Numeric arrays stay in the file and are decoded
// on demand by the typed getters.
//
// Thread-safety: immutable after construction; all const methods are safe to
// call concurrently. Open() maps the file privately; if another process
// truncates the file while it is mapped, reading tensor data faults (SIGBUS),
// as with any mmap-based loader: replace model files by rename, never in place.
//
//   KVD_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file,
//                        GgufFile::Open(path));
//   const std::string arch(file->architecture());
//   KVD_ASSIGN_OR_RETURN(uint64_t n_layers,
//                        file->GetUint64(arch + ".block_count"));
//   KVD_ASSIGN_OR_RETURN(absl::Span<const std::string_view> vocab,
//                        file->GetStringArray("tokenizer.ggml.tokens"));
//   // nullptr if absent:
//   const GgufTensor* wq = file->FindTensor("blk.0.attn_q.weight");
#ifndef KVD_OPS_GGUF_GGUF_FILE_H_
#define KVD_OPS_GGUF_GGUF_FILE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/quant/ggml_type.h"

namespace kvd::ops {

// GGUF metadata value types, with the file format's numeric ids.
enum class GgufValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

// "uint8", "string", "array", ...; "unknown" for ids outside the enum.
std::string_view GgufValueTypeName(GgufValueType type);

// Bytes per value of a scalar type (bool is 1 byte); 0 for string and array.
uint64_t GgufValueTypeSize(GgufValueType type);

// One metadata value. Scalars are decoded at parse time; strings and string
// arrays are views into the file; numeric arrays are read from the file on
// access.
class GgufValue {
 public:
  GgufValueType type() const { return type_; }
  // "uint32", "string", "array<string>", ... for error messages.
  std::string TypeDescription() const;

  // Scalars. Each accessor requires the matching kind of type(): AsUint64 for
  // uint8..uint64, AsInt64 for int8..int64, AsDouble for float32/float64
  // (float32 widened exactly), AsBool, AsString. Calling one on another type
  // returns 0 / false / "".
  uint64_t AsUint64() const { return IsUnsigned(type_) ? scalar_.u : 0; }
  int64_t AsInt64() const { return IsSigned(type_) ? scalar_.i : 0; }
  double AsDouble() const { return IsFloat(type_) ? scalar_.f : 0.0; }
  bool AsBool() const { return type_ == GgufValueType::kBool && scalar_.b; }
  std::string_view AsString() const {
    return type_ == GgufValueType::kString ? string_ : "";
  }

  // Arrays (type() == kArray). Elements of numeric arrays are little-endian and
  // unaligned in the file; use the Array* accessors or GgufFile's typed array
  // getters.
  GgufValueType array_type() const { return array_type_; }
  uint64_t array_size() const { return array_size_; }
  // Element i of a numeric or bool array as the matching kind (see the scalar
  // accessors).
  uint64_t ArrayUint64(uint64_t i) const;
  int64_t ArrayInt64(uint64_t i) const;
  double ArrayDouble(uint64_t i) const;
  // The elements of a string array (empty for other arrays).
  absl::Span<const std::string_view> array_strings() const { return strings_; }

  static bool IsUnsigned(GgufValueType t);
  static bool IsSigned(GgufValueType t);
  static bool IsFloat(GgufValueType t);

 private:
  friend class GgufParser;

  GgufValueType type_ = GgufValueType::kUint8;
  union {
    uint64_t u;
    int64_t i;
    double f;
    bool b;
  } scalar_ = {0};
  std::string_view string_;
  GgufValueType array_type_ = GgufValueType::kUint8;
  uint64_t array_size_ = 0;
  const uint8_t* array_data_ =
      nullptr;  // numeric arrays: array_size_ packed elements
  std::vector<std::string_view> strings_;
};

// One tensor's descriptor. Dims follow GGML's ne[]: dims[0] is the innermost
// (contiguous) one, the row length; a [rows, cols] matrix in PyTorch terms has
// dims {cols, rows}.
struct GgufTensor {
  std::string name;
  kernels::GgmlType type = kernels::GgmlType::kF32;
  std::vector<int64_t> dims;  // 1 to 4 entries, each >= 1
  int64_t num_elements = 0;   // product of dims
  uint64_t offset = 0;        // absolute byte offset of the data in the file
  uint64_t size_bytes = 0;    // bytes of data
  const uint8_t* data =
      nullptr;  // into the mapped file; lives as long as the GgufFile

  int64_t row_length() const { return dims[0]; }
  int64_t num_rows() const { return num_elements / dims[0]; }
  uint64_t row_bytes() const {
    return size_bytes / static_cast<uint64_t>(num_rows());
  }
};

class GgufFile {
 public:
  // Memory-maps and parses `path`. NOT_FOUND if it does not exist,
  // INVALID_ARGUMENT if it is not a valid GGUF v2/v3 file.
  static absl::StatusOr<std::unique_ptr<GgufFile>> Open(
      const std::string& path);

  // Parses `size` bytes at `data`, which must stay valid and unchanged for the
  // lifetime of the returned object. `name` is used in error messages and as
  // path().
  static absl::StatusOr<std::unique_ptr<GgufFile>> Parse(std::string name,
                                                         const uint8_t* data,
                                                         size_t size);

  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  // Drops the file's pages from this process's resident memory (they are read
  // back from the page cache if touched again). For after the weights were
  // copied out: the mapped file otherwise counts a second time in RSS.
  void ReleaseResidentPages() const;
  // The same for the whole pages inside [data, data + bytes) of the mapping
  // (one tensor's data once the loader has copied it out).
  void ReleaseResidentPages(const uint8_t* data, size_t bytes) const;
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  // Absolute offset of the (aligned) tensor data section.
  uint64_t data_section_offset() const { return data_section_offset_; }
  size_t file_size() const { return size_; }

  // Metadata, in file order.
  const std::vector<std::pair<std::string_view, GgufValue>>& metadata() const {
    return kvs_;
  }
  // nullptr if the key is absent.
  const GgufValue* Find(std::string_view key) const;

  // Typed getters. NOT_FOUND if the key is absent; INVALID_ARGUMENT if its type
  // does not fit (the message names the file, the key, the expected and the
  // actual type).
  absl::StatusOr<std::string_view> GetString(std::string_view key) const;
  // Any unsigned integer type, or a signed one holding a non-negative value.
  absl::StatusOr<uint64_t> GetUint64(std::string_view key) const;
  // Any integer type whose value fits in int64.
  absl::StatusOr<int64_t> GetInt64(std::string_view key) const;
  // float32 or float64 (float64 rounded to float).
  absl::StatusOr<float> GetFloat(std::string_view key) const;
  absl::StatusOr<bool> GetBool(std::string_view key) const;
  absl::StatusOr<absl::Span<const std::string_view>> GetStringArray(
      std::string_view key) const;
  // Array of float32 or float64.
  absl::StatusOr<std::vector<float>> GetFloatArray(std::string_view key) const;
  // Array of any integer type whose values all fit in int32.
  absl::StatusOr<std::vector<int32_t>> GetInt32Array(
      std::string_view key) const;

  // As above, but an absent key yields `default_value`; a present key of the
  // wrong type is still an error.
  absl::StatusOr<std::string_view> GetStringOr(
      std::string_view key, std::string_view default_value) const;
  absl::StatusOr<uint64_t> GetUint64Or(std::string_view key,
                                       uint64_t default_value) const;
  absl::StatusOr<int64_t> GetInt64Or(std::string_view key,
                                     int64_t default_value) const;
  absl::StatusOr<float> GetFloatOr(std::string_view key,
                                   float default_value) const;
  absl::StatusOr<bool> GetBoolOr(std::string_view key,
                                 bool default_value) const;

  // general.architecture ("llama", "gemma3", ...); empty if absent or not a
  // string.
  std::string_view architecture() const;

  // Tensors, in file order.
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  // nullptr if absent.
  const GgufTensor* FindTensor(std::string_view name) const;
  // NOT_FOUND naming the file and the tensor if absent.
  absl::StatusOr<const GgufTensor*> GetTensor(std::string_view name) const;

 private:
  friend class GgufParser;
  GgufFile() = default;

  // NOT_FOUND naming the file and key if absent.
  absl::StatusOr<const GgufValue*> Lookup(std::string_view key) const;
  absl::Status WrongType(std::string_view key, const GgufValue& value,
                         std::string_view expected) const;

  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  // Non-null when this object owns an mmap of mapping_size_ bytes.
  void* mapping_ = nullptr;
  size_t mapping_size_ = 0;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_section_offset_ = 0;
  std::vector<std::pair<std::string_view, GgufValue>> kvs_;
  absl::flat_hash_map<std::string_view, size_t> kv_index_;
  std::vector<GgufTensor> tensors_;
  absl::flat_hash_map<std::string_view, size_t> tensor_index_;
};

}  // namespace kvd::ops

#endif  // KVD_OPS_GGUF_GGUF_FILE_H_
