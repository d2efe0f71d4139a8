#include "ops/safetensors/safetensors_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/quant/half.h"
#include "nlohmann/json.hpp"

// The format is little-endian; tensors are handed out as raw bytes in host
// order.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors reader assumes little-endian");

namespace kvd::ops {
namespace {

using Json = nlohmann::json;

struct DtypeInfo {
  SafetensorsDtype dtype;
  const char* name;
  int bits;
};

constexpr DtypeInfo kDtypes[] = {
    {SafetensorsDtype::kBool, "BOOL", 8},
    {SafetensorsDtype::kU8, "U8", 8},
    {SafetensorsDtype::kI8, "I8", 8},
    {SafetensorsDtype::kF8E5M2, "F8_E5M2", 8},
    {SafetensorsDtype::kF8E4M3, "F8_E4M3", 8},
    {SafetensorsDtype::kF8E8M0, "F8_E8M0", 8},
    {SafetensorsDtype::kI16, "I16", 16},
    {SafetensorsDtype::kU16, "U16", 16},
    {SafetensorsDtype::kF16, "F16", 16},
    {SafetensorsDtype::kBF16, "BF16", 16},
    {SafetensorsDtype::kI32, "I32", 32},
    {SafetensorsDtype::kU32, "U32", 32},
    {SafetensorsDtype::kF32, "F32", 32},
    {SafetensorsDtype::kF64, "F64", 64},
    {SafetensorsDtype::kI64, "I64", 64},
    {SafetensorsDtype::kU64, "U64", 64},
    {SafetensorsDtype::kC64, "C64", 64},
    {SafetensorsDtype::kF4, "F4", 4},
    {SafetensorsDtype::kF6E2M3, "F6_E2M3", 6},
    {SafetensorsDtype::kF6E3M2, "F6_E3M2", 6},
};

const DtypeInfo* FindDtype(absl::string_view name) {
  for (const DtypeInfo& info : kDtypes) {
    if (name == info.name) return &info;
  }
  return nullptr;
}

std::string KnownDtypes() {
  std::vector<absl::string_view> names;
  for (const DtypeInfo& info : kDtypes) names.push_back(info.name);
  return absl::StrJoin(names, ", ");
}

// A header is an object of objects holding short arrays; anything deeper is
// hostile.
constexpr int kMaxJsonDepth = 8;

// First pass over the header: rejects duplicate keys (which the DOM parser
// would silently merge) and runaway nesting, before any DOM is built. Returning
// false stops the parse.
class HeaderValidator : public nlohmann::json_sax<Json> {
 public:
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return Push(); }
  bool end_object() override { return Pop(); }
  bool start_array(std::size_t) override { return Push(); }
  bool end_array() override { return Pop(); }
  bool key(string_t& key) override {
    Level& level = stack_.back();
    if (!level.keys.insert(key).second) {
      if (stack_.size() == 1) {
        error_ = absl::StrCat("duplicate tensor name '", key, "'");
      } else {
        error_ = absl::StrCat("duplicate key '", key, "' in entry '",
                              stack_[1].name, "'");
      }
      return false;
    }
    last_key_ = key;
    return true;
  }
  bool parse_error(std::size_t, const std::string&,
                   const nlohmann::detail::exception& e) override {
    error_ = absl::StrCat("header is not valid JSON: ", e.what());
    return false;
  }

  const std::string& error() const { return error_; }

 private:
  struct Level {
    std::string name;            // the key this value sits under in its parent
    std::set<std::string> keys;  // stays empty for arrays
  };

  bool Push() {
    if (static_cast<int>(stack_.size()) >= kMaxJsonDepth) {
      error_ = absl::StrCat("header JSON is nested deeper than ", kMaxJsonDepth,
                            " levels");
      return false;
    }
    stack_.push_back(Level{last_key_, {}});
    return true;
  }
  bool Pop() {
    stack_.pop_back();
    return true;
  }

  std::vector<Level> stack_;
  std::string last_key_;
  std::string error_;
};

class ErrorPrefix {
 public:
  explicit ErrorPrefix(absl::string_view file) : file_(file) {}
  absl::Status File(absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors file '", file_, "': ", what));
  }
  absl::Status Tensor(absl::string_view tensor, absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(
        "safetensors file '", file_, "': tensor '", tensor, "': ", what));
  }

 private:
  absl::string_view file_;
};

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Reads a non-negative JSON integer; false for negative numbers, floats and
// non-numbers.
bool AsUint64(const Json& v, uint64_t* out) {
  if (!v.is_number_unsigned())
    return false;  // negative ints and floats are not unsigned
  *out = v.get<uint64_t>();
  return true;
}

absl::Status ParseEntry(const ErrorPrefix& err, const std::string& name,
                        const Json& entry, SafetensorsFile::Tensor* t) {
  if (!entry.is_object()) return err.Tensor(name, "entry is not a JSON object");
  for (const char* required : {"dtype", "shape", "data_offsets"}) {
    if (!entry.contains(required)) {
      return err.Tensor(name, absl::StrCat("entry has no '", required, "'"));
    }
  }
  for (const auto& [key, value] : entry.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets") {
      return err.Tensor(
          name,
          absl::StrCat("unexpected key '", key,
                       "' (an entry has only dtype, shape, data_offsets)"));
    }
  }
  t->name = name;

  const Json& dtype = entry["dtype"];
  if (!dtype.is_string()) return err.Tensor(name, "dtype is not a string");
  const DtypeInfo* info = FindDtype(dtype.get_ref<const std::string&>());
  if (info == nullptr) {
    return err.Tensor(name, absl::StrCat("unknown dtype '",
                                         dtype.get_ref<const std::string&>(),
                                         "' (known: ", KnownDtypes(), ")"));
  }
  t->dtype = info->dtype;

  const Json& shape = entry["shape"];
  if (!shape.is_array()) return err.Tensor(name, "shape is not an array");
  int64_t elements = 1;
  for (const Json& dim : shape) {
    uint64_t d;
    if (!AsUint64(dim, &d)) {
      return err.Tensor(
          name,
          absl::StrCat("shape ", shape.dump(),
                       " has an entry that is not a non-negative integer"));
    }
    if (d > static_cast<uint64_t>(INT64_MAX) ||
        __builtin_mul_overflow(elements, static_cast<int64_t>(d), &elements)) {
      return err.Tensor(name, absl::StrCat("shape ", shape.dump(),
                                           " has more than 2^63 elements"));
    }
    t->shape.push_back(static_cast<int64_t>(d));
  }
  t->num_elements = elements;
  uint64_t bits;
  if (__builtin_mul_overflow(static_cast<uint64_t>(elements),
                             static_cast<uint64_t>(info->bits), &bits)) {
    return err.Tensor(
        name, absl::StrCat("shape ", shape.dump(), " is too large for dtype ",
                           info->name));
  }
  if (bits % 8 != 0) {
    return err.Tensor(name,
                      absl::StrCat(elements, " elements of ", info->name,
                                   " do not fill a whole number of bytes"));
  }
  t->size_bytes = bits / 8;

  const Json& offsets = entry["data_offsets"];
  uint64_t begin, end;
  if (!offsets.is_array() || offsets.size() != 2 ||
      !AsUint64(offsets[0], &begin) || !AsUint64(offsets[1], &end)) {
    return err.Tensor(
        name, absl::StrCat("data_offsets ", offsets.dump(),
                           " is not [begin, end] of non-negative integers"));
  }
  if (end < begin) {
    return err.Tensor(name, absl::StrCat("data_offsets [", begin, ", ", end,
                                         "] end before they begin"));
  }
  if (end - begin != t->size_bytes) {
    return err.Tensor(
        name,
        absl::StrCat("data_offsets [", begin, ", ", end, "] span ", end - begin,
                     " bytes but dtype ", info->name, " with shape ",
                     ShapeString(t->shape), " needs ", t->size_bytes));
  }
  t->data_offset = begin;
  return absl::OkStatus();
}

absl::Status ParseMetadata(const ErrorPrefix& err, const Json& value,
                           std::map<std::string, std::string>* metadata) {
  if (value.is_null())
    return absl::OkStatus();  // as the official reader allows
  if (!value.is_object()) return err.File("__metadata__ is not a JSON object");
  for (const auto& [key, v] : value.items()) {
    if (!v.is_string()) {
      return err.File(
          absl::StrCat("__metadata__ value of '", key, "' is not a string"));
    }
    (*metadata)[key] = v.get<std::string>();
  }
  return absl::OkStatus();
}

// Checks that the tensors, sorted by offset, tile [0, data_size) exactly.
absl::Status CheckLayout(const ErrorPrefix& err, uint64_t data_size,
                         const std::vector<SafetensorsFile::Tensor>& tensors) {
  uint64_t expected = 0;
  const SafetensorsFile::Tensor* previous = nullptr;
  for (const SafetensorsFile::Tensor& t : tensors) {
    const uint64_t end =
        t.data_offset +
        t.size_bytes;  // no overflow: both came from JSON uint64s
    if (t.data_offset < expected) {
      return err.Tensor(t.name,
                        absl::StrCat("data_offsets [", t.data_offset, ", ", end,
                                     "] overlap tensor '", previous->name,
                                     "' which ends at ", expected));
    }
    if (t.data_offset > expected) {
      return err.Tensor(
          t.name, absl::StrCat("data_offsets [", t.data_offset, ", ", end,
                               "] leave a gap of ", t.data_offset - expected,
                               " bytes after ", expected));
    }
    if (end > data_size) {
      return err.Tensor(
          t.name, absl::StrCat("data_offsets [", t.data_offset, ", ", end,
                               "] run past the end of the data section (",
                               data_size, " bytes); the file is truncated"));
    }
    expected = end;
    previous = &t;
  }
  if (expected != data_size) {
    return err.File(absl::StrCat(
        "the tensors cover ", expected, " bytes of the ", data_size,
        "-byte data section; the rest belongs to no tensor"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::string_view SafetensorsDtypeName(SafetensorsDtype dtype) {
  for (const DtypeInfo& info : kDtypes) {
    if (info.dtype == dtype) return info.name;
  }
  return "?";
}

int SafetensorsDtypeBits(SafetensorsDtype dtype) {
  for (const DtypeInfo& info : kDtypes) {
    if (info.dtype == dtype) return info.bits;
  }
  return 0;
}

bool SafetensorsDtypeToFloatSupported(SafetensorsDtype dtype) {
  return dtype == SafetensorsDtype::kF32 || dtype == SafetensorsDtype::kF16 ||
         dtype == SafetensorsDtype::kBF16;
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Parse(absl::string_view name,
                                                       const void* data,
                                                       size_t size) {
  const ErrorPrefix err(name);
  const auto* bytes = static_cast<const uint8_t*>(data);
  if (size < 8) {
    return err.File(absl::StrCat(
        "only ", size, " bytes; too short for the 8-byte header length"));
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];
  if (header_len > kMaxHeaderBytes) {
    return err.File(absl::StrCat("header length ", header_len,
                                 " exceeds the limit of ", kMaxHeaderBytes,
                                 " bytes"));
  }
  if (header_len > size - 8) {
    return err.File(absl::StrCat(
        "header length ", header_len, " runs past the end of the ", size,
        "-byte file; the file is truncated or not safetensors"));
  }
  const char* header_begin = reinterpret_cast<const char*>(bytes + 8);
  const char* header_end = header_begin + header_len;
  // nlohmann skips a leading byte-order mark; JSON (RFC 8259) and the official
  // reader do not accept one.
  if (header_len >= 3 && std::memcmp(header_begin, "\xEF\xBB\xBF", 3) == 0) {
    return err.File("header starts with a UTF-8 byte-order mark");
  }

  SafetensorsFile file;
  file.name_ = std::string(name);
  file.data_size_ = size - 8 - header_len;
  const uint8_t* data_section = bytes + 8 + header_len;

  // nlohmann may throw (std::bad_alloc, or a type error on a path we did not
  // foresee); nothing may escape this boundary.
  try {
    HeaderValidator validator;
    if (!Json::sax_parse(header_begin, header_end, &validator) ||
        !validator.error().empty()) {
      return err.File(validator.error().empty() ? "header is not valid JSON"
                                                : validator.error());
    }
    const Json header = Json::parse(header_begin, header_end, nullptr,
                                    /*allow_exceptions=*/false);
    if (header.is_discarded()) return err.File("header is not valid JSON");
    if (!header.is_object()) {
      return err.File(absl::StrCat("header is a JSON ", header.type_name(),
                                   ", not an object"));
    }
    for (const auto& [key, value] : header.items()) {
      if (key == "__metadata__") {
        absl::Status s = ParseMetadata(err, value, &file.metadata_);
        if (!s.ok()) return s;
        continue;
      }
      Tensor t;
      absl::Status s = ParseEntry(err, key, value, &t);
      if (!s.ok()) return s;
      file.tensors_.push_back(std::move(t));
    }
  } catch (const std::exception& e) {
    return err.File(absl::StrCat("cannot parse header: ", e.what()));
  }

  std::sort(file.tensors_.begin(), file.tensors_.end(),
            [](const Tensor& a, const Tensor& b) {
              return std::tie(a.data_offset, a.size_bytes, a.name) <
                     std::tie(b.data_offset, b.size_bytes, b.name);
            });
  absl::Status layout = CheckLayout(err, file.data_size_, file.tensors_);
  if (!layout.ok()) return layout;
  for (size_t i = 0; i < file.tensors_.size(); ++i) {
    Tensor& t = file.tensors_[i];
    t.data = data_section + t.data_offset;
    file.index_.emplace(t.name, i);
  }
  return file;
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::ErrnoToStatus(
        errno, absl::StrCat("cannot open safetensors file '", path, "'"));
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int e = errno;
    close(fd);
    return absl::ErrnoToStatus(
        e, absl::StrCat("cannot stat safetensors file '", path, "'"));
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors file '", path, "' is not a regular file"));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size <
      8) {  // mmap cannot map an empty file; Parse gives the proper error
    close(fd);
    const char empty[8] = {};
    return Parse(path, empty, size);
  }
  void* mapping = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int mmap_errno = errno;
  close(fd);  // the mapping keeps the file referenced
  if (mapping == MAP_FAILED) {
    return absl::ErrnoToStatus(
        mmap_errno, absl::StrCat("cannot map safetensors file '", path, "'"));
  }
  absl::StatusOr<SafetensorsFile> file = Parse(path, mapping, size);
  if (!file.ok()) {
    munmap(mapping, size);
    return file.status();
  }
  file->mapping_ = mapping;
  file->mapping_size_ = size;
  return file;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept {
  *this = std::move(other);
}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
  if (this != &other) {
    Unmap();
    name_ = std::move(other.name_);
    mapping_ = std::exchange(other.mapping_, nullptr);
    mapping_size_ = std::exchange(other.mapping_size_, 0);
    data_size_ = other.data_size_;
    tensors_ = std::move(other.tensors_);
    index_ = std::move(other.index_);
    metadata_ = std::move(other.metadata_);
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() { Unmap(); }

void SafetensorsFile::Unmap() {
  if (mapping_ != nullptr) munmap(mapping_, mapping_size_);
  mapping_ = nullptr;
  mapping_size_ = 0;
}

const SafetensorsFile::Tensor* SafetensorsFile::FindTensor(
    absl::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

absl::Status SafetensorsFile::ToFloat(const Tensor& tensor, float* dst,
                                      int64_t n) const {
  if (n != tensor.num_elements) {
    return absl::InvalidArgumentError(absl::StrCat(
        "safetensors file '", name_, "': tensor '", tensor.name, "' has ",
        tensor.num_elements, " elements but the destination holds ", n));
  }
  if (n > 0 && dst == nullptr) {
    return absl::InvalidArgumentError("ToFloat: destination is null");
  }
  // tensor.data is not aligned in general, so every element is read through
  // memcpy.
  switch (tensor.dtype) {
    case SafetensorsDtype::kF32:
      if (n > 0)
        std::memcpy(dst, tensor.data, static_cast<size_t>(n) * sizeof(float));
      return absl::OkStatus();
    case SafetensorsDtype::kF16:
    case SafetensorsDtype::kBF16: {
      const bool is_f16 = tensor.dtype == SafetensorsDtype::kF16;
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, tensor.data + 2 * i, sizeof(h));
        dst[i] = is_f16 ? kernels::Fp16ToFp32(h) : kernels::Bf16ToFp32(h);
      }
      return absl::OkStatus();
    }
    default:
      return absl::UnimplementedError(
          absl::StrCat("safetensors file '", name_, "': tensor '", tensor.name,
                       "' has dtype ", SafetensorsDtypeName(tensor.dtype),
                       "; only F32, F16 and BF16 convert to float"));
  }
}

}  // namespace kvd::ops
