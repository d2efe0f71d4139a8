#include "ops/gguf/gguf_writer.h"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "kernels/quant/ggml_type.h"
#include "kernels/quant/half.h"

namespace kvd::ops {
namespace {

using kernels::GgmlType;

template <typename T>
void Put(std::string* out, T v) {
  char buf[sizeof(T)];
  std::memcpy(buf, &v, sizeof(T));
  out->append(buf, sizeof(T));
}

void PutString(std::string* out, std::string_view s) {
  Put<uint64_t>(out, s.size());
  out->append(s.data(), s.size());
}

std::string DimsString(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i)
    absl::StrAppendFormat(&s, "%s%d", i ? ", " : "", dims[i]);
  return s + "]";
}

}  // namespace

GgufWriter::GgufWriter(uint64_t alignment) : alignment_(alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0 ||
      alignment > std::numeric_limits<uint32_t>::max()) {
    Fail(absl::InvalidArgumentError(absl::StrFormat(
        "GgufWriter: alignment %u is not a power of two below 2^32",
        alignment)));
    alignment_ = 32;
  }
}

void GgufWriter::Fail(absl::Status s) {
  if (status_.ok()) status_ = std::move(s);
}

bool GgufWriter::StartKey(std::string_view key, GgufValueType type) {
  if (key.empty()) {
    Fail(absl::InvalidArgumentError("GgufWriter: empty metadata key"));
    return false;
  }
  if (!keys_.emplace(key).second) {
    Fail(absl::InvalidArgumentError(
        absl::StrFormat("GgufWriter: duplicate metadata key '%s'", key)));
    return false;
  }
  ++n_kv_;
  PutString(&kv_bytes_, key);
  Put<uint32_t>(&kv_bytes_, static_cast<uint32_t>(type));
  return true;
}

void GgufWriter::AddScalar(std::string_view key, GgufValueType type,
                           const void* v, size_t size) {
  if (!StartKey(key, type)) return;
  kv_bytes_.append(static_cast<const char*>(v), size);
}

void GgufWriter::AddUint8(std::string_view key, uint8_t v) {
  AddScalar(key, GgufValueType::kUint8, &v, sizeof(v));
}
void GgufWriter::AddInt8(std::string_view key, int8_t v) {
  AddScalar(key, GgufValueType::kInt8, &v, sizeof(v));
}
void GgufWriter::AddUint16(std::string_view key, uint16_t v) {
  AddScalar(key, GgufValueType::kUint16, &v, sizeof(v));
}
void GgufWriter::AddInt16(std::string_view key, int16_t v) {
  AddScalar(key, GgufValueType::kInt16, &v, sizeof(v));
}
void GgufWriter::AddUint32(std::string_view key, uint32_t v) {
  if (key == "general.alignment" && v != alignment_) {
    Fail(absl::InvalidArgumentError(
        absl::StrFormat("GgufWriter: general.alignment %u differs from the "
                        "writer's alignment %u; pass the "
                        "alignment to the constructor",
                        v, alignment_)));
    return;
  }
  AddScalar(key, GgufValueType::kUint32, &v, sizeof(v));
}
void GgufWriter::AddInt32(std::string_view key, int32_t v) {
  AddScalar(key, GgufValueType::kInt32, &v, sizeof(v));
}
void GgufWriter::AddFloat32(std::string_view key, float v) {
  AddScalar(key, GgufValueType::kFloat32, &v, sizeof(v));
}
void GgufWriter::AddBool(std::string_view key, bool v) {
  const uint8_t b = v ? 1 : 0;
  AddScalar(key, GgufValueType::kBool, &b, 1);
}
void GgufWriter::AddUint64(std::string_view key, uint64_t v) {
  AddScalar(key, GgufValueType::kUint64, &v, sizeof(v));
}
void GgufWriter::AddInt64(std::string_view key, int64_t v) {
  AddScalar(key, GgufValueType::kInt64, &v, sizeof(v));
}
void GgufWriter::AddFloat64(std::string_view key, double v) {
  AddScalar(key, GgufValueType::kFloat64, &v, sizeof(v));
}
void GgufWriter::AddString(std::string_view key, std::string_view v) {
  if (!StartKey(key, GgufValueType::kString)) return;
  PutString(&kv_bytes_, v);
}

void GgufWriter::AddStringArray(std::string_view key,
                                absl::Span<const std::string> values) {
  if (!StartKey(key, GgufValueType::kArray)) return;
  Put<uint32_t>(&kv_bytes_, static_cast<uint32_t>(GgufValueType::kString));
  Put<uint64_t>(&kv_bytes_, values.size());
  for (const std::string& s : values) PutString(&kv_bytes_, s);
}

void GgufWriter::AddStringArray(std::string_view key,
                                absl::Span<const std::string_view> values) {
  if (!StartKey(key, GgufValueType::kArray)) return;
  Put<uint32_t>(&kv_bytes_, static_cast<uint32_t>(GgufValueType::kString));
  Put<uint64_t>(&kv_bytes_, values.size());
  for (std::string_view s : values) PutString(&kv_bytes_, s);
}

void GgufWriter::AddBoolArray(std::string_view key,
                              const std::vector<bool>& values) {
  if (!StartKey(key, GgufValueType::kArray)) return;
  Put<uint32_t>(&kv_bytes_, static_cast<uint32_t>(GgufValueType::kBool));
  Put<uint64_t>(&kv_bytes_, values.size());
  for (bool b : values) kv_bytes_.push_back(b ? 1 : 0);
}

void GgufWriter::AddArrayRaw(std::string_view key, GgufValueType elem,
                             const void* data, uint64_t count,
                             size_t elem_size) {
  if (!StartKey(key, GgufValueType::kArray)) return;
  Put<uint32_t>(&kv_bytes_, static_cast<uint32_t>(elem));
  Put<uint64_t>(&kv_bytes_, count);
  kv_bytes_.append(static_cast<const char*>(data), count * elem_size);
}

int64_t GgufWriter::CheckDims(std::string_view name,
                              const std::vector<int64_t>& dims) {
  if (dims.empty() || dims.size() > 4) {
    Fail(absl::InvalidArgumentError(
        absl::StrFormat("GgufWriter: tensor '%s' has %d dims (must be 1 to 4)",
                        name, dims.size())));
    return -1;
  }
  int64_t n = 1;
  for (int64_t d : dims) {
    if (d <= 0 || __builtin_mul_overflow(n, d, &n)) {
      Fail(absl::InvalidArgumentError(
          absl::StrFormat("GgufWriter: tensor '%s' has invalid dims %s", name,
                          DimsString(dims))));
      return -1;
    }
  }
  return n;
}

void GgufWriter::AddTensor(std::string_view name, GgmlType type,
                           std::vector<int64_t> dims, std::string bytes) {
  if (name.empty()) {
    Fail(absl::InvalidArgumentError("GgufWriter: empty tensor name"));
    return;
  }
  if (!tensor_names_.emplace(name).second) {
    Fail(absl::InvalidArgumentError(
        absl::StrFormat("GgufWriter: duplicate tensor name '%s'", name)));
    return;
  }
  tensors_.push_back(
      Tensor{std::string(name), type, std::move(dims), std::move(bytes)});
}

void GgufWriter::AddTensorF32(std::string_view name, std::vector<int64_t> dims,
                              absl::Span<const float> values) {
  const int64_t n = CheckDims(name, dims);
  if (n < 0) return;
  if (static_cast<uint64_t>(n) != values.size()) {
    Fail(absl::InvalidArgumentError(absl::StrFormat(
        "GgufWriter: tensor '%s' dims %s need %d values, got %d", name,
        DimsString(dims), n, values.size())));
    return;
  }
  AddTensor(name, GgmlType::kF32, std::move(dims),
            std::string(reinterpret_cast<const char*>(values.data()),
                        values.size() * 4));
}

void GgufWriter::AddTensorF16(std::string_view name, std::vector<int64_t> dims,
                              absl::Span<const float> values) {
  const int64_t n = CheckDims(name, dims);
  if (n < 0) return;
  if (static_cast<uint64_t>(n) != values.size()) {
    Fail(absl::InvalidArgumentError(absl::StrFormat(
        "GgufWriter: tensor '%s' dims %s need %d values, got %d", name,
        DimsString(dims), n, values.size())));
    return;
  }
  std::string bytes;
  bytes.reserve(values.size() * 2);
  for (float v : values) Put<uint16_t>(&bytes, kernels::Fp32ToFp16(v));
  AddTensor(name, GgmlType::kF16, std::move(dims), std::move(bytes));
}

void GgufWriter::AddTensorBF16(std::string_view name, std::vector<int64_t> dims,
                               absl::Span<const float> values) {
  const int64_t n = CheckDims(name, dims);
  if (n < 0) return;
  if (static_cast<uint64_t>(n) != values.size()) {
    Fail(absl::InvalidArgumentError(absl::StrFormat(
        "GgufWriter: tensor '%s' dims %s need %d values, got %d", name,
        DimsString(dims), n, values.size())));
    return;
  }
  std::string bytes;
  bytes.reserve(values.size() * 2);
  for (float v : values) Put<uint16_t>(&bytes, kernels::Fp32ToBf16(v));
  AddTensor(name, GgmlType::kBF16, std::move(dims), std::move(bytes));
}

void GgufWriter::AddTensorRaw(std::string_view name, GgmlType type,
                              std::vector<int64_t> dims,
                              absl::Span<const uint8_t> bytes) {
  const int64_t n = CheckDims(name, dims);
  if (n < 0) return;
  if (!kernels::IsKnownGgmlType(static_cast<uint32_t>(type))) {
    Fail(absl::InvalidArgumentError(
        absl::StrFormat("GgufWriter: tensor '%s' has unknown type id %u", name,
                        static_cast<uint32_t>(type))));
    return;
  }
  if (dims[0] % kernels::BlockSize(type) != 0) {
    Fail(absl::InvalidArgumentError(absl::StrFormat(
        "GgufWriter: tensor '%s' row length %d is not a multiple of the %s "
        "block size %d",
        name, dims[0], kernels::GgmlTypeName(type), kernels::BlockSize(type))));
    return;
  }
  absl::StatusOr<uint64_t> need = kernels::RowBytes(type, n);
  if (!need.ok() || *need != bytes.size()) {
    Fail(absl::InvalidArgumentError(absl::StrFormat(
        "GgufWriter: tensor '%s' (%s, dims %s) needs %u bytes, got %u", name,
        kernels::GgmlTypeName(type), DimsString(dims), need.ok() ? *need : 0,
        bytes.size())));
    return;
  }
  AddTensor(
      name, type, std::move(dims),
      std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

absl::StatusOr<std::string> GgufWriter::WriteToString() const {
  if (!status_.ok()) return status_;
  // general.alignment goes where the caller added it (as
  // GGUFWriter.add_custom_alignment does), else last, and only when it is not
  // the default.
  std::string alignment_kv;
  if (alignment_ != 32 && !keys_.contains("general.alignment")) {
    PutString(&alignment_kv, "general.alignment");
    Put<uint32_t>(&alignment_kv, static_cast<uint32_t>(GgufValueType::kUint32));
    Put<uint32_t>(&alignment_kv, static_cast<uint32_t>(alignment_));
  }
  std::string out;
  Put<uint32_t>(&out, 0x46554747);  // "GGUF"
  Put<uint32_t>(&out, 3);
  Put<uint64_t>(&out, tensors_.size());
  Put<uint64_t>(&out, n_kv_ + (alignment_kv.empty() ? 0 : 1));
  out += kv_bytes_;
  out += alignment_kv;
  const auto pad = [this](uint64_t x) {
    return (x + alignment_ - 1) & ~(alignment_ - 1);
  };
  uint64_t offset = 0;
  for (const Tensor& t : tensors_) {
    PutString(&out, t.name);
    Put<uint32_t>(&out, static_cast<uint32_t>(t.dims.size()));
    for (int64_t d : t.dims) Put<uint64_t>(&out, static_cast<uint64_t>(d));
    Put<uint32_t>(&out, static_cast<uint32_t>(t.type));
    Put<uint64_t>(&out, offset);
    offset = pad(offset + t.bytes.size());
  }
  out.resize(pad(out.size()), '\0');
  for (const Tensor& t : tensors_) {
    out += t.bytes;
    out.resize(pad(out.size()), '\0');
  }
  return out;
}

absl::Status GgufWriter::WriteToFile(const std::string& path) const {
  absl::StatusOr<std::string> bytes = WriteToString();
  if (!bytes.ok()) return bytes.status();
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(bytes->data(), static_cast<std::streamsize>(bytes->size()));
    out.close();
    if (!out) {
      std::remove(tmp.c_str());
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: cannot write file", tmp));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: cannot rename into place", path));
  }
  return absl::OkStatus();
}

}  // namespace kvd::ops
