#include "ops/gguf/gguf_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "kernels/quant/ggml_type.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "GGUF files are little-endian and are read in place");

namespace kvd::ops {
namespace {

using kernels::GgmlType;

constexpr uint32_t kMagic =
    0x46554747;  // "GGUF" read as a little-endian uint32
constexpr uint64_t kDefaultAlignment = 32;
constexpr uint32_t kMaxDims = 4;
constexpr uint32_t kMaxValueType =
    static_cast<uint32_t>(GgufValueType::kFloat64);
// Smallest possible encodings, used to cap counts by the bytes left before
// allocating. A key/value: key length (8) + type (4) + a 1-byte value. A tensor
// info: name length (8) + n_dims (4) + one dim (8) + type (4) + offset (8).
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;

template <typename T>
T Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

}  // namespace

// Reads the file front to back with a bounds-checked cursor. Every count read
// from the file is checked against the bytes left before anything is allocated
// for it.
class GgufParser {
 public:
  explicit GgufParser(GgufFile* file)
      : f_(file), data_(file->data_), size_(file->size_) {}

  absl::Status Run() {
    KVD_RETURN_IF_ERROR(ReadHeader());
    KVD_RETURN_IF_ERROR(ReadMetadata());
    KVD_RETURN_IF_ERROR(ReadAlignment());
    KVD_RETURN_IF_ERROR(ReadTensorInfos());
    return PlaceTensors();
  }

 private:
  template <typename... Args>
  absl::Status Invalid(const absl::FormatSpec<Args...>& format,
                       const Args&... args) const {
    return absl::InvalidArgumentError(
        absl::StrCat(f_->path_, ": ", absl::StrFormat(format, args...)));
  }

  uint64_t Left() const { return size_ - pos_; }

  absl::Status Need(uint64_t n, std::string_view what) const {
    if (n > Left()) {
      return Invalid(
          "truncated: %s needs %u bytes at offset %u but the file is %u bytes",
          what, n, pos_, size_);
    }
    return absl::OkStatus();
  }

  template <typename T>
  absl::StatusOr<T> Read(std::string_view what) {
    KVD_RETURN_IF_ERROR(Need(sizeof(T), what));
    T v = Load<T>(data_ + pos_);
    pos_ += sizeof(T);
    return v;
  }

  absl::StatusOr<std::string_view> ReadString(std::string_view what) {
    const uint64_t at = pos_;
    KVD_ASSIGN_OR_RETURN(uint64_t len, Read<uint64_t>(what));
    if (len > Left()) {
      return Invalid(
          "%s at offset %u has length %u, past the end of the file (%u bytes)",
          what, at, len, size_);
    }
    std::string_view s(reinterpret_cast<const char*>(data_ + pos_), len);
    pos_ += len;
    return s;
  }

  absl::Status ReadHeader() {
    if (size_ < 4) {
      return Invalid("file is %u bytes, too small to be a GGUF file", size_);
    }
    KVD_ASSIGN_OR_RETURN(uint32_t magic, Read<uint32_t>("magic"));
    if (magic != kMagic) {
      return Invalid("bad magic 0x%08x (expected \"GGUF\"): not a GGUF file",
                     magic);
    }
    KVD_ASSIGN_OR_RETURN(f_->version_, Read<uint32_t>("version"));
    const uint32_t v = f_->version_;
    if (v != 2 && v != 3) {
      if (__builtin_bswap32(v) == 2 || __builtin_bswap32(v) == 3) {
        return Invalid("big-endian GGUF files are not supported");
      }
      if (v == 1) {
        return Invalid(
            "GGUF version 1 is not supported (only 2 and 3); re-convert the "
            "model");
      }
      return Invalid("unsupported GGUF version %u (only 2 and 3 are supported)",
                     v);
    }
    KVD_ASSIGN_OR_RETURN(n_tensors_, Read<uint64_t>("tensor count"));
    KVD_ASSIGN_OR_RETURN(n_kv_, Read<uint64_t>("metadata count"));
    if (n_kv_ > Left() / kMinKvBytes) {
      return Invalid(
          "metadata count %u cannot fit in the %u bytes left in the file",
          n_kv_, Left());
    }
    if (n_tensors_ > Left() / kMinTensorInfoBytes) {
      return Invalid(
          "tensor count %u cannot fit in the %u bytes left in the file",
          n_tensors_, Left());
    }
    return absl::OkStatus();
  }

  absl::Status ReadMetadata() {
    f_->kvs_.reserve(n_kv_);
    f_->kv_index_.reserve(n_kv_);
    for (uint64_t i = 0; i < n_kv_; ++i) {
      const std::string what = absl::StrFormat("metadata key #%u", i);
      KVD_ASSIGN_OR_RETURN(std::string_view key, ReadString(what));
      if (key.empty())
        return Invalid("%s at offset %u is empty", what, pos_ - 8);
      const std::string key_what = absl::StrFormat("metadata key '%s'", key);
      GgufValue value;
      KVD_ASSIGN_OR_RETURN(uint32_t type, Read<uint32_t>(key_what + " type"));
      KVD_RETURN_IF_ERROR(ReadValue(key_what, type, &value));
      auto [it, inserted] = f_->kv_index_.emplace(key, f_->kvs_.size());
      if (!inserted) {
        return Invalid("duplicate metadata key '%s' (entries #%u and #%u)", key,
                       it->second, i);
      }
      f_->kvs_.emplace_back(key, std::move(value));
    }
    return absl::OkStatus();
  }

  absl::Status CheckType(std::string_view what, uint32_t type) const {
    if (type > kMaxValueType) {
      return Invalid("%s has unknown value type %u", what, type);
    }
    return absl::OkStatus();
  }

  absl::Status ReadValue(const std::string& what, uint32_t raw_type,
                         GgufValue* out) {
    KVD_RETURN_IF_ERROR(CheckType(what, raw_type));
    const auto type = static_cast<GgufValueType>(raw_type);
    out->type_ = type;
    switch (type) {
      case GgufValueType::kString: {
        KVD_ASSIGN_OR_RETURN(out->string_, ReadString(what));
        return absl::OkStatus();
      }
      case GgufValueType::kArray:
        return ReadArray(what, out);
      default:
        return ReadScalar(what, type, data_ + pos_, out);
    }
  }

  // Decodes one scalar at `p` (after checking it fits at pos_) and advances.
  absl::Status ReadScalar(const std::string& what, GgufValueType type,
                          const uint8_t* p, GgufValue* out) {
    KVD_RETURN_IF_ERROR(Need(GgufValueTypeSize(type), what));
    switch (type) {
      case GgufValueType::kUint8:
        out->scalar_.u = *p;
        break;
      case GgufValueType::kInt8:
        out->scalar_.i = Load<int8_t>(p);
        break;
      case GgufValueType::kUint16:
        out->scalar_.u = Load<uint16_t>(p);
        break;
      case GgufValueType::kInt16:
        out->scalar_.i = Load<int16_t>(p);
        break;
      case GgufValueType::kUint32:
        out->scalar_.u = Load<uint32_t>(p);
        break;
      case GgufValueType::kInt32:
        out->scalar_.i = Load<int32_t>(p);
        break;
      case GgufValueType::kFloat32:
        out->scalar_.f = Load<float>(p);
        break;
      case GgufValueType::kBool:
        if (*p > 1)
          return Invalid("%s: bool value %u is neither 0 nor 1", what, *p);
        out->scalar_.b = *p != 0;
        break;
      case GgufValueType::kUint64:
        out->scalar_.u = Load<uint64_t>(p);
        break;
      case GgufValueType::kInt64:
        out->scalar_.i = Load<int64_t>(p);
        break;
      case GgufValueType::kFloat64:
        out->scalar_.f = Load<double>(p);
        break;
      default:
        return absl::InternalError("ReadScalar called on a non-scalar type");
    }
    pos_ += GgufValueTypeSize(type);
    return absl::OkStatus();
  }

  absl::Status ReadArray(const std::string& what, GgufValue* out) {
    KVD_ASSIGN_OR_RETURN(uint32_t raw_elem,
                         Read<uint32_t>(what + " array element type"));
    KVD_RETURN_IF_ERROR(CheckType(what + " array element", raw_elem));
    const auto elem = static_cast<GgufValueType>(raw_elem);
    if (elem == GgufValueType::kArray) {
      return Invalid("%s: nested arrays are not supported", what);
    }
    const uint64_t at = pos_;
    KVD_ASSIGN_OR_RETURN(uint64_t n, Read<uint64_t>(what + " array length"));
    out->array_type_ = elem;
    out->array_size_ = n;
    if (elem == GgufValueType::kString) {
      if (n > Left() / 8) {
        return Invalid(
            "%s: array of %u strings at offset %u cannot fit in the %u bytes "
            "left",
            what, n, at, Left());
      }
      out->strings_.reserve(n);
      for (uint64_t i = 0; i < n; ++i) {
        KVD_ASSIGN_OR_RETURN(std::string_view s, ReadString(what));
        out->strings_.push_back(s);
      }
      return absl::OkStatus();
    }
    const uint64_t elem_size = GgufValueTypeSize(elem);
    if (n > Left() / elem_size) {
      return Invalid(
          "%s: array of %u %s values at offset %u runs past the end of the "
          "file "
          "(%u bytes)",
          what, n, GgufValueTypeName(elem), at, size_);
    }
    out->array_data_ = data_ + pos_;
    if (elem == GgufValueType::kBool) {
      for (uint64_t i = 0; i < n; ++i) {
        if (data_[pos_ + i] > 1) {
          return Invalid("%s: bool array element %u is %u, neither 0 nor 1",
                         what, i, data_[pos_ + i]);
        }
      }
    }
    pos_ += n * elem_size;
    return absl::OkStatus();
  }

  absl::Status ReadAlignment() {
    const GgufValue* v = f_->Find("general.alignment");
    f_->alignment_ = kDefaultAlignment;
    if (v == nullptr) return absl::OkStatus();
    uint64_t a;
    if (GgufValue::IsUnsigned(v->type())) {
      a = v->AsUint64();
    } else if (GgufValue::IsSigned(v->type()) && v->AsInt64() > 0) {
      a = static_cast<uint64_t>(v->AsInt64());
    } else {
      return Invalid(
          "general.alignment has type %s, expected a positive integer (uint32)",
          v->TypeDescription());
    }
    if (a == 0 || (a & (a - 1)) != 0) {
      return Invalid("general.alignment %u is not a power of two", a);
    }
    f_->alignment_ = a;
    return absl::OkStatus();
  }

  absl::Status ReadTensorInfos() {
    if (n_tensors_ > Left() / kMinTensorInfoBytes) {
      return Invalid(
          "tensor count %u cannot fit in the %u bytes left after the metadata",
          n_tensors_, Left());
    }
    f_->tensors_.reserve(n_tensors_);
    f_->tensor_index_.reserve(n_tensors_);
    rel_offsets_.reserve(n_tensors_);
    for (uint64_t i = 0; i < n_tensors_; ++i) {
      KVD_ASSIGN_OR_RETURN(
          std::string_view name,
          ReadString(absl::StrFormat("name of tensor #%u", i)));
      if (name.empty()) return Invalid("tensor #%u has an empty name", i);
      const std::string what = absl::StrFormat("tensor '%s'", name);
      GgufTensor t;
      t.name = std::string(name);
      KVD_ASSIGN_OR_RETURN(uint32_t n_dims, Read<uint32_t>(what + " n_dims"));
      if (n_dims == 0 || n_dims > kMaxDims) {
        return Invalid("%s has %u dimensions (must be 1 to %u)", what, n_dims,
                       kMaxDims);
      }
      uint64_t ne = 1;
      for (uint32_t d = 0; d < n_dims; ++d) {
        KVD_ASSIGN_OR_RETURN(uint64_t dim, Read<uint64_t>(what + " dims"));
        if (dim == 0 ||
            dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
          return Invalid("%s dimension %u is %u (must be 1 to 2^63-1)", what, d,
                         dim);
        }
        if (__builtin_mul_overflow(ne, dim, &ne) ||
            ne > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
          return Invalid("%s element count overflows int64 at dimension %u",
                         what, d);
        }
        t.dims.push_back(static_cast<int64_t>(dim));
      }
      t.num_elements = static_cast<int64_t>(ne);
      KVD_ASSIGN_OR_RETURN(uint32_t raw_type, Read<uint32_t>(what + " type"));
      if (!kernels::IsKnownGgmlType(raw_type)) {
        return Invalid("%s has unknown GGML type id %u", what, raw_type);
      }
      t.type = static_cast<GgmlType>(raw_type);
      const int64_t block = kernels::BlockSize(t.type);
      if (t.dims[0] % block != 0) {
        return Invalid(
            "%s row length %d is not a multiple of the %s block size %d", what,
            t.dims[0], kernels::GgmlTypeName(t.type), block);
      }
      absl::StatusOr<uint64_t> bytes =
          kernels::RowBytes(t.type, t.num_elements);
      if (!bytes.ok()) return Invalid("%s: %s", what, bytes.status().message());
      t.size_bytes = *bytes;
      KVD_ASSIGN_OR_RETURN(uint64_t offset, Read<uint64_t>(what + " offset"));
      if (offset % f_->alignment_ != 0) {
        return Invalid(
            "%s data offset %u is not a multiple of the alignment %u", what,
            offset, f_->alignment_);
      }
      auto [it, inserted] =
          f_->tensor_index_.emplace(name, f_->tensors_.size());
      if (!inserted) {
        return Invalid("duplicate tensor name '%s' (tensors #%u and #%u)", name,
                       it->second, i);
      }
      rel_offsets_.push_back(offset);
      f_->tensors_.push_back(std::move(t));
    }
    return absl::OkStatus();
  }

  absl::Status PlaceTensors() {
    const uint64_t a = f_->alignment_;
    uint64_t start;
    if (__builtin_add_overflow(pos_, a - 1, &start)) {
      return Invalid("tensor data section offset overflows (alignment %u)", a);
    }
    start &= ~(a - 1);
    f_->data_section_offset_ = start;
    std::vector<GgufTensor>& ts = f_->tensors_;
    for (size_t i = 0; i < ts.size(); ++i) {
      GgufTensor& t = ts[i];
      uint64_t begin, end;
      if (__builtin_add_overflow(start, rel_offsets_[i], &begin) ||
          __builtin_add_overflow(begin, t.size_bytes, &end)) {
        return Invalid("tensor '%s' data offset %u + size %u overflows", t.name,
                       rel_offsets_[i], t.size_bytes);
      }
      if (end > size_) {
        return Invalid(
            "tensor '%s' data [%u, %u) runs past end of file (%u bytes)",
            t.name, begin, end, size_);
      }
      t.offset = begin;
      t.data = data_ + begin;
    }
    std::vector<size_t> order(ts.size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&ts](size_t x, size_t y) {
      return ts[x].offset < ts[y].offset;
    });
    for (size_t k = 1; k < order.size(); ++k) {
      const GgufTensor& p = ts[order[k - 1]];
      const GgufTensor& c = ts[order[k]];
      if (p.offset + p.size_bytes > c.offset) {
        return Invalid(
            "tensors '%s' data [%u, %u) and '%s' data [%u, %u) overlap", p.name,
            p.offset, p.offset + p.size_bytes, c.name, c.offset,
            c.offset + c.size_bytes);
      }
    }
    return absl::OkStatus();
  }

  GgufFile* f_;
  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
  uint64_t n_tensors_ = 0;
  uint64_t n_kv_ = 0;
  std::vector<uint64_t> rel_offsets_;
};

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Parse(std::string name,
                                                          const uint8_t* data,
                                                          size_t size) {
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->path_ = std::move(name);
  file->data_ = data;
  file->size_ = size;
  GgufParser parser(file.get());
  KVD_RETURN_IF_ERROR(parser.Run());
  return file;
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(
    const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    const std::string msg =
        absl::StrFormat("%s: cannot open: %s", path, std::strerror(err));
    if (err == ENOENT) return absl::NotFoundError(msg);
    if (err == EACCES) return absl::PermissionDeniedError(msg);
    return absl::InvalidArgumentError(msg);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: not a regular file", path));
  }
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->path_ = path;
  const size_t size = static_cast<size_t>(st.st_size);
  if (size > 0) {
    void* m = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: mmap of %u bytes failed: %s", path, size, std::strerror(err)));
    }
    file->mapping_ = m;
    file->mapping_size_ = size;
    file->data_ = static_cast<const uint8_t*>(m);
  }
  ::close(fd);
  file->size_ = size;
  GgufParser parser(file.get());
  KVD_RETURN_IF_ERROR(parser.Run());
  return file;
}

void GgufFile::ReleaseResidentPages() const {
  // Read-only private mapping: no page was ever written, so nothing is lost.
  if (mapping_ != nullptr) ::madvise(mapping_, mapping_size_, MADV_DONTNEED);
}

void GgufFile::ReleaseResidentPages(const uint8_t* data, size_t bytes) const {
  const auto* base = static_cast<const uint8_t*>(mapping_);
  if (mapping_ == nullptr || data < base || data + bytes > base + mapping_size_)
    return;
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin =
      (reinterpret_cast<uintptr_t>(data) + page - 1) / page * page;
  const uintptr_t end =
      (reinterpret_cast<uintptr_t>(data) + bytes) / page * page;
  if (end > begin) {
    ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
  }
}

GgufFile::~GgufFile() {
  if (mapping_ != nullptr) ::munmap(mapping_, mapping_size_);
}

const GgufValue* GgufFile::Find(std::string_view key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kvs_[it->second].second;
}

std::string_view GgufFile::architecture() const {
  const GgufValue* v = Find("general.architecture");
  return v == nullptr ? std::string_view() : v->AsString();
}

const GgufTensor* GgufFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

absl::StatusOr<const GgufTensor*> GgufFile::GetTensor(
    std::string_view name) const {
  const GgufTensor* t = FindTensor(name);
  if (t == nullptr) {
    return absl::NotFoundError(
        absl::StrFormat("%s: tensor '%s' not found", path_, name));
  }
  return t;
}

}  // namespace kvd::ops
