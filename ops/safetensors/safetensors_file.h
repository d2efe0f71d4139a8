// Reader for the safetensors weight format (Hugging Face), memory-mapped and
// validated.
//
// Layout: an 8-byte little-endian header length N, N bytes of JSON
//   {"<tensor>": {"dtype": "F32", "shape": [2, 3],
//                 "data_offsets": [begin, end]},
//    ...,
//    "__metadata__": {"key": "value", ...}}
// then the data section; offsets are relative to its start.
//
// Every file is treated as hostile. Open/Parse reject, with INVALID_ARGUMENT
// naming the file, the tensor and the fault: a header length over 100 MB or
// past the end of the file; JSON that is not strict, not an object, nested
// deeper than a header can be, or has a duplicate key at any level (plain JSON
// parsers silently keep one of them); a tensor entry without exactly the keys
// dtype, shape and data_offsets with the right types; an unknown dtype; a
// negative or overflowing shape; data_offsets whose size is not elements x
// dtype size; and tensors that overlap, leave gaps or do not exactly cover the
// data section. After a successful Open/Parse every tensor's bytes lie inside
// the buffer, so readers need no further bounds checks.
//
// Ownership: Open() maps the file and the SafetensorsFile owns the mapping
// (unmapped on destruction; moves keep the tensors' pointers valid). Parse()
// copies nothing: the caller's buffer must outlive the SafetensorsFile.
//
// Thread-safety: immutable after construction; all const methods may be called
// concurrently.
//
//   KVD_ASSIGN_OR_RETURN(SafetensorsFile file,
//                        SafetensorsFile::Open("model.safetensors"));
//   const SafetensorsFile::Tensor* w = file.FindTensor("lm_head.weight");
//   if (w == nullptr) return absl::NotFoundError("no lm_head.weight");
//   std::vector<float> values(w->num_elements);
//   KVD_RETURN_IF_ERROR(file.ToFloat(*w, values.data(), w->num_elements));
#ifndef KVD_OPS_SAFETENSORS_SAFETENSORS_FILE_H_
#define KVD_OPS_SAFETENSORS_SAFETENSORS_FILE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvd::ops {

// Element types of the safetensors format (the names are those of the format's
// "dtype" field).
enum class SafetensorsDtype {
  kBool,
  kU8,
  kI8,
  kF8E5M2,
  kF8E4M3,
  kF8E8M0,
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kF64,
  kI64,
  kU64,
  kC64,
  kF4,
  kF6E2M3,
  kF6E3M2,
};

// "F32", "BF16", ... as written in the header.
absl::string_view SafetensorsDtypeName(SafetensorsDtype dtype);

// Storage bits per element (4 and 6 for the packed FP4/FP6 types, else a
// multiple of 8).
int SafetensorsDtypeBits(SafetensorsDtype dtype);

// Whether ToFloat() can convert tensors of this dtype (F32, F16, BF16).
bool SafetensorsDtypeToFloatSupported(SafetensorsDtype dtype);

class SafetensorsFile {
 public:
  // Largest header accepted; the official implementation uses the same bound.
  static constexpr uint64_t kMaxHeaderBytes = 100'000'000;

  struct Tensor {
    std::string name;
    SafetensorsDtype dtype;
    std::vector<int64_t> shape;  // row-major, outermost first; [] is a scalar
    int64_t num_elements = 0;    // product of shape (1 for a scalar)
    // The tensor's bytes in the buffer. Not aligned in general: read through
    // memcpy.
    const uint8_t* data = nullptr;
    uint64_t size_bytes = 0;
    // From the start of the data section, as in the header.
    uint64_t data_offset = 0;
  };

  // Maps and validates the file at `path`. NOT_FOUND if it does not exist,
  // another errno-derived code if it cannot be opened or mapped,
  // INVALID_ARGUMENT if it is malformed.
  static absl::StatusOr<SafetensorsFile> Open(const std::string& path);

  // Validates `size` bytes at `data` (not copied; must outlive the result).
  // `name` is used in error messages only.
  static absl::StatusOr<SafetensorsFile> Parse(absl::string_view name,
                                               const void* data, size_t size);

  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  // The path given to Open or the name given to Parse.
  const std::string& name() const { return name_; }

  // All tensors, in data-section order (ascending offset).
  const std::vector<Tensor>& tensors() const { return tensors_; }

  // The tensor called `name`, or nullptr.
  const Tensor* FindTensor(absl::string_view name) const;

  // The "__metadata__" string map (empty if the header has none).
  const std::map<std::string, std::string>& metadata() const {
    return metadata_;
  }

  // Size of the data section in bytes.
  uint64_t data_size() const { return data_size_; }

  // Converts `tensor` (one of this file's) to fp32 into dst[0, n).
  // INVALID_ARGUMENT if `n` is not the tensor's element count; UNIMPLEMENTED
  // for dtypes other than F32, F16 and BF16. Conversions are exact (every
  // fp16/bf16 value is an fp32 value), NaN payloads included.
  absl::Status ToFloat(const Tensor& tensor, float* dst, int64_t n) const;

 private:
  SafetensorsFile() = default;
  void Unmap();

  std::string name_;
  void* mapping_ = nullptr;  // owned when non-null (Open); Parse leaves it null
  size_t mapping_size_ = 0;
  uint64_t data_size_ = 0;
  std::vector<Tensor> tensors_;
  // Name -> position in tensors_.
  std::map<std::string, size_t, std::less<>> index_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace kvd::ops

#endif  // KVD_OPS_SAFETENSORS_SAFETENSORS_FILE_H_
