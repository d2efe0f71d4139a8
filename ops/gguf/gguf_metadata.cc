#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "ops/gguf/gguf_file.h"

// GgufValue decoding and GgufFile's typed metadata getters (the parser is in
// gguf_file.cc).

namespace kvd::ops {
namespace {

template <typename T>
T Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

}  // namespace

uint64_t GgufValueTypeSize(GgufValueType t) {
  switch (t) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kBool:
      return 1;
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
      return 2;
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kFloat32:
      return 4;
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
    case GgufValueType::kFloat64:
      return 8;
    default:
      return 0;
  }
}

std::string_view GgufValueTypeName(GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8:
      return "uint8";
    case GgufValueType::kInt8:
      return "int8";
    case GgufValueType::kUint16:
      return "uint16";
    case GgufValueType::kInt16:
      return "int16";
    case GgufValueType::kUint32:
      return "uint32";
    case GgufValueType::kInt32:
      return "int32";
    case GgufValueType::kFloat32:
      return "float32";
    case GgufValueType::kBool:
      return "bool";
    case GgufValueType::kString:
      return "string";
    case GgufValueType::kArray:
      return "array";
    case GgufValueType::kUint64:
      return "uint64";
    case GgufValueType::kInt64:
      return "int64";
    case GgufValueType::kFloat64:
      return "float64";
  }
  return "unknown";
}

bool GgufValue::IsUnsigned(GgufValueType t) {
  return t == GgufValueType::kUint8 || t == GgufValueType::kUint16 ||
         t == GgufValueType::kUint32 || t == GgufValueType::kUint64;
}

bool GgufValue::IsSigned(GgufValueType t) {
  return t == GgufValueType::kInt8 || t == GgufValueType::kInt16 ||
         t == GgufValueType::kInt32 || t == GgufValueType::kInt64;
}

bool GgufValue::IsFloat(GgufValueType t) {
  return t == GgufValueType::kFloat32 || t == GgufValueType::kFloat64;
}

uint64_t GgufValue::ArrayUint64(uint64_t i) const {
  if (type_ != GgufValueType::kArray || i >= array_size_ ||
      array_data_ == nullptr)
    return 0;
  const uint8_t* p = array_data_ + i * GgufValueTypeSize(array_type_);
  switch (array_type_) {
    case GgufValueType::kUint8:
    case GgufValueType::kBool:
      return *p;
    case GgufValueType::kUint16:
      return Load<uint16_t>(p);
    case GgufValueType::kUint32:
      return Load<uint32_t>(p);
    case GgufValueType::kUint64:
      return Load<uint64_t>(p);
    default:
      return 0;
  }
}

int64_t GgufValue::ArrayInt64(uint64_t i) const {
  if (type_ != GgufValueType::kArray || i >= array_size_ ||
      array_data_ == nullptr)
    return 0;
  const uint8_t* p = array_data_ + i * GgufValueTypeSize(array_type_);
  switch (array_type_) {
    case GgufValueType::kInt8:
      return Load<int8_t>(p);
    case GgufValueType::kInt16:
      return Load<int16_t>(p);
    case GgufValueType::kInt32:
      return Load<int32_t>(p);
    case GgufValueType::kInt64:
      return Load<int64_t>(p);
    default:
      return 0;
  }
}

double GgufValue::ArrayDouble(uint64_t i) const {
  if (type_ != GgufValueType::kArray || i >= array_size_ ||
      array_data_ == nullptr)
    return 0;
  const uint8_t* p = array_data_ + i * GgufValueTypeSize(array_type_);
  switch (array_type_) {
    case GgufValueType::kFloat32:
      return Load<float>(p);
    case GgufValueType::kFloat64:
      return Load<double>(p);
    default:
      return 0;
  }
}

std::string GgufValue::TypeDescription() const {
  if (type_ == GgufValueType::kArray) {
    return absl::StrFormat("array<%s>", GgufValueTypeName(array_type_));
  }
  return std::string(GgufValueTypeName(type_));
}

absl::StatusOr<const GgufValue*> GgufFile::Lookup(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) {
    return absl::NotFoundError(
        absl::StrFormat("%s: metadata key '%s' not found", path_, key));
  }
  return v;
}

absl::Status GgufFile::WrongType(std::string_view key, const GgufValue& value,
                                 std::string_view expected) const {
  return absl::InvalidArgumentError(
      absl::StrFormat("%s: metadata key '%s' has type %s, expected %s", path_,
                      key, value.TypeDescription(), expected));
}

absl::StatusOr<std::string_view> GgufFile::GetString(
    std::string_view key) const {
  KVD_ASSIGN_OR_RETURN(const GgufValue* v, Lookup(key));
  if (v->type() != GgufValueType::kString) return WrongType(key, *v, "string");
  return v->AsString();
}

absl::StatusOr<uint64_t> GgufFile::GetUint64(std::string_view key) const {
  KVD_ASSIGN_OR_RETURN(const GgufValue* v, Lookup(key));
  if (GgufValue::IsUnsigned(v->type())) return v->AsUint64();
  if (GgufValue::IsSigned(v->type())) {
    if (v->AsInt64() < 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: metadata key '%s' is %d, expected a non-negative value", path_,
          key, v->AsInt64()));
    }
    return static_cast<uint64_t>(v->AsInt64());
  }
  return WrongType(key, *v, "an unsigned integer");
}

absl::StatusOr<int64_t> GgufFile::GetInt64(std::string_view key) const {
  KVD_ASSIGN_OR_RETURN(const GgufValue* v, Lookup(key));
  if (GgufValue::IsSigned(v->type())) return v->AsInt64();
  if (GgufValue::IsUnsigned(v->type())) {
    if (v->AsUint64() >
        static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: metadata key '%s' is %u, which does not fit in int64", path_,
          key, v->AsUint64()));
    }
    return static_cast<int64_t>(v->AsUint64());
  }
  return WrongType(key, *v, "an integer");
}

absl::StatusOr<float> GgufFile::GetFloat(std::string_view key) const {
  KVD_ASSIGN_OR_RETURN(const GgufValue* v, Lookup(key));
  if (!GgufValue::IsFloat(v->type()))
    return WrongType(key, *v, "float32 or float64");
  return static_cast<float>(v->AsDouble());
}

absl::StatusOr<bool> GgufFile::GetBool(std::string_view key) const {
  KVD_ASSIGN_OR_RETURN(const GgufValue* v, Lookup(key));
  if (v->type() != GgufValueType::kBool) return WrongType(key, *v, "bool");
  return v->AsBool();
}

absl::StatusOr<absl::Span<const std::string_view>> GgufFile::GetStringArray(
    std::string_view key) const {
  KVD_ASSIGN_OR_RETURN(const GgufValue* v, Lookup(key));
  if (v->type() != GgufValueType::kArray ||
      v->array_type() != GgufValueType::kString) {
    return WrongType(key, *v, "array<string>");
  }
  return v->array_strings();
}

absl::StatusOr<std::vector<float>> GgufFile::GetFloatArray(
    std::string_view key) const {
  KVD_ASSIGN_OR_RETURN(const GgufValue* v, Lookup(key));
  if (v->type() != GgufValueType::kArray ||
      !GgufValue::IsFloat(v->array_type())) {
    return WrongType(key, *v, "array<float32> or array<float64>");
  }
  std::vector<float> out(v->array_size());
  for (uint64_t i = 0; i < out.size(); ++i)
    out[i] = static_cast<float>(v->ArrayDouble(i));
  return out;
}

absl::StatusOr<std::vector<int32_t>> GgufFile::GetInt32Array(
    std::string_view key) const {
  KVD_ASSIGN_OR_RETURN(const GgufValue* v, Lookup(key));
  const bool is_unsigned = GgufValue::IsUnsigned(v->array_type());
  if (v->type() != GgufValueType::kArray ||
      !(is_unsigned || GgufValue::IsSigned(v->array_type()))) {
    return WrongType(key, *v, "an array of integers");
  }
  std::vector<int32_t> out(v->array_size());
  for (uint64_t i = 0; i < out.size(); ++i) {
    bool fits;
    if (is_unsigned) {
      const uint64_t x = v->ArrayUint64(i);
      fits = x <= static_cast<uint64_t>(std::numeric_limits<int32_t>::max());
      out[i] = static_cast<int32_t>(x);
    } else {
      const int64_t x = v->ArrayInt64(i);
      fits = x >= std::numeric_limits<int32_t>::min() &&
             x <= std::numeric_limits<int32_t>::max();
      out[i] = static_cast<int32_t>(x);
    }
    if (!fits) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: metadata key '%s' element %u does not fit in int32", path_, key,
          i));
    }
  }
  return out;
}

absl::StatusOr<std::string_view> GgufFile::GetStringOr(
    std::string_view key, std::string_view default_value) const {
  if (Find(key) == nullptr) return default_value;
  return GetString(key);
}

absl::StatusOr<uint64_t> GgufFile::GetUint64Or(std::string_view key,
                                               uint64_t default_value) const {
  if (Find(key) == nullptr) return default_value;
  return GetUint64(key);
}

absl::StatusOr<int64_t> GgufFile::GetInt64Or(std::string_view key,
                                             int64_t default_value) const {
  if (Find(key) == nullptr) return default_value;
  return GetInt64(key);
}

absl::StatusOr<float> GgufFile::GetFloatOr(std::string_view key,
                                           float default_value) const {
  if (Find(key) == nullptr) return default_value;
  return GetFloat(key);
}

absl::StatusOr<bool> GgufFile::GetBoolOr(std::string_view key,
                                         bool default_value) const {
  if (Find(key) == nullptr) return default_value;
  return GetBool(key);
}

}  // namespace kvd::ops
