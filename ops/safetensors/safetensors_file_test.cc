#include "ops/safetensors/safetensors_file.h"

#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace kvd::ops {
namespace {

using ::testing::HasSubstr;

// Written by tools/reference/make_safetensors_testdata.py with the official
// safetensors package.
constexpr char kTestdata[] = "ops/safetensors/testdata/";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

SafetensorsDtype DtypeFromName(const std::string& name) {
  for (int d = 0; d <= static_cast<int>(SafetensorsDtype::kF6E3M2); ++d) {
    if (SafetensorsDtypeName(static_cast<SafetensorsDtype>(d)) == name) {
      return static_cast<SafetensorsDtype>(d);
    }
  }
  ADD_FAILURE() << "unknown dtype " << name;
  return SafetensorsDtype::kBool;
}

TEST(SafetensorsFileTest, ReadsFileWrittenByReferenceImplementation) {
  const nlohmann::json expected = nlohmann::json::parse(
      ReadFile(std::string(kTestdata) + "tensors.expected.json"));
  absl::StatusOr<SafetensorsFile> file =
      SafetensorsFile::Open(std::string(kTestdata) + "tensors.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();

  EXPECT_EQ(file->data_size(), expected["data_size"].get<uint64_t>());
  std::map<std::string, std::string> metadata = expected["metadata"];
  EXPECT_EQ(file->metadata(), metadata);
  ASSERT_EQ(file->tensors().size(), expected["tensors"].size());

  for (const nlohmann::json& want : expected["tensors"]) {
    const std::string name = want["name"];
    SCOPED_TRACE(name);
    const SafetensorsFile::Tensor* t = file->FindTensor(name);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->name, name);
    EXPECT_EQ(t->dtype, DtypeFromName(want["dtype"]));
    EXPECT_EQ(t->shape, want["shape"].get<std::vector<int64_t>>());
    const uint64_t begin = want["data_offsets"][0];
    const uint64_t end = want["data_offsets"][1];
    EXPECT_EQ(t->data_offset, begin);
    EXPECT_EQ(t->size_bytes, end - begin);
    int64_t elements = 1;
    for (int64_t d : t->shape) elements *= d;
    EXPECT_EQ(t->num_elements, elements);

    std::vector<float> values(t->num_elements);
    const absl::Status s = file->ToFloat(*t, values.data(), t->num_elements);
    if (want.contains("int_values")) {
      EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
      EXPECT_THAT(s.message(), HasSubstr(name));
      // The raw bytes are still there for a caller that knows the dtype.
      std::vector<int32_t> ints(t->num_elements);
      std::memcpy(ints.data(), t->data, t->size_bytes);
      EXPECT_EQ(ints, want["int_values"].get<std::vector<int32_t>>());
      continue;
    }
    ASSERT_TRUE(s.ok()) << s;
    const std::vector<uint32_t> want_bits = want["f32_bits"];
    ASSERT_EQ(values.size(), want_bits.size());
    for (size_t i = 0; i < values.size(); ++i) {
      EXPECT_EQ(Bits(values[i]), want_bits[i])
          << "element " << i << " = " << values[i];
    }
  }
}

TEST(SafetensorsFileTest,
     TensorsAreInDataOrderAndFindTensorMissesUnknownNames) {
  absl::StatusOr<SafetensorsFile> file =
      SafetensorsFile::Open(std::string(kTestdata) + "tensors.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  uint64_t next = 0;
  for (const SafetensorsFile::Tensor& t : file->tensors()) {
    EXPECT_EQ(t.data_offset, next) << t.name;
    next = t.data_offset + t.size_bytes;
  }
  EXPECT_EQ(next, file->data_size());
  EXPECT_EQ(file->FindTensor("no.such.tensor"), nullptr);
  EXPECT_EQ(file->FindTensor("model.w_f3"), nullptr);
}

TEST(SafetensorsFileTest, ParseAgreesWithOpenAndDoesNotCopy) {
  const std::string bytes =
      ReadFile(std::string(kTestdata) + "tensors.safetensors");
  absl::StatusOr<SafetensorsFile> file =
      SafetensorsFile::Parse("in-memory", bytes.data(), bytes.size());
  ASSERT_TRUE(file.ok()) << file.status();
  const auto* begin = reinterpret_cast<const uint8_t*>(bytes.data());
  for (const SafetensorsFile::Tensor& t : file->tensors()) {
    EXPECT_GE(t.data, begin);
    EXPECT_LE(t.data + t.size_bytes, begin + bytes.size());
  }
  // Moving keeps the tensors' pointers valid.
  SafetensorsFile moved = std::move(*file);
  const SafetensorsFile::Tensor* t = moved.FindTensor("scalar_f32");
  ASSERT_NE(t, nullptr);
  float v = 0;
  ASSERT_TRUE(moved.ToFloat(*t, &v, 1).ok());
  EXPECT_EQ(v, 3.25f);
}

TEST(SafetensorsFileTest, ToFloatChecksTheDestinationSize) {
  absl::StatusOr<SafetensorsFile> file =
      SafetensorsFile::Open(std::string(kTestdata) + "tensors.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  const SafetensorsFile::Tensor* t = file->FindTensor("model.w_f32");
  ASSERT_NE(t, nullptr);
  std::vector<float> values(t->num_elements + 1);
  const absl::Status s = file->ToFloat(*t, values.data(), t->num_elements + 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("model.w_f32"));
  EXPECT_EQ(file->ToFloat(*t, nullptr, t->num_elements).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SafetensorsFileTest, MissingFileIsNotFound) {
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(
      std::string(kTestdata) + "no_such_file.safetensors");
  EXPECT_EQ(file.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(file.status().message(), HasSubstr("no_such_file.safetensors"));
}

TEST(SafetensorsFileTest, DirectoryIsRejected) {
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(kTestdata);
  EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument);
}

// Each hostile file (written by make_safetensors_testdata.py, and rejected by
// the official package too except where noted) and a phrase its error must
// contain.
struct BadCase {
  const char* file;
  const char* message;
};

void PrintTo(const BadCase& c, std::ostream* os) { *os << c.file; }

class BadFileTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadFileTest, IsRejectedWithAClearError) {
  const std::string path =
      std::string(kTestdata) + "bad/" + GetParam().file + ".safetensors";
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
  ASSERT_FALSE(file.ok()) << path << " was accepted";
  EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument)
      << file.status();
  EXPECT_THAT(file.status().message(), HasSubstr(path));
  EXPECT_THAT(file.status().message(), HasSubstr(GetParam().message));

  // The in-memory path gives the same verdict.
  const std::string bytes = ReadFile(path);
  absl::StatusOr<SafetensorsFile> parsed =
      SafetensorsFile::Parse("mem", bytes.data(), bytes.size());
  ASSERT_FALSE(parsed.ok());
  EXPECT_THAT(parsed.status().message(), HasSubstr(GetParam().message));
}

INSTANTIATE_TEST_SUITE_P(
    Hostile, BadFileTest,
    ::testing::Values(
        BadCase{"empty", "too short for the 8-byte header length"},
        BadCase{"truncated_length", "too short for the 8-byte header length"},
        BadCase{"truncated_header", "runs past the end"},
        BadCase{"header_length_huge", "exceeds the limit"},
        BadCase{"header_length_past_end", "runs past the end"},
        BadCase{"byte_order_mark", "byte-order mark"},
        BadCase{"invalid_json", "not valid JSON"},
        BadCase{"trailing_garbage", "not valid JSON"},
        BadCase{"header_not_object", "not an object"},
        BadCase{"entry_not_object", "tensor 'a': entry is not a JSON object"},
        BadCase{"missing_dtype", "tensor 'a': entry has no 'dtype'"},
        BadCase{"missing_shape", "tensor 'a': entry has no 'shape'"},
        BadCase{"missing_offsets", "tensor 'a': entry has no 'data_offsets'"},
        BadCase{"unknown_dtype", "tensor 'b': unknown dtype 'F17'"},
        BadCase{"dtype_not_string", "tensor 'b': dtype is not a string"},
        // The official package ignores unknown keys; kvd refuses what it does
        // not understand.
        BadCase{"extra_field", "tensor 'b': unexpected key 'foo'"},
        BadCase{"negative_shape",
                "tensor 'b': shape [-3] has an entry that is not"},
        BadCase{"float_shape",
                "tensor 'b': shape [3.0] has an entry that is not"},
        BadCase{"huge_shape_value",
                "tensor 'b': shape [1e+30] has an entry that is not"},
        BadCase{"overflowing_shape",
                "tensor 'b': shape [4294967296,4294967296,4294967296] has "
                "more than 2^63 elements"},
        BadCase{"shape_not_array", "tensor 'b': shape is not an array"},
        BadCase{"wrong_size_offsets",
                "tensor 'a': data_offsets [0, 12] span 12 bytes but dtype "
                "F32 with shape [2] needs 8"},
        BadCase{"offsets_reversed",
                "tensor 'b': data_offsets [14, 8] end before they begin"},
        BadCase{"offsets_one_value",
                "tensor 'b': data_offsets [8] is not [begin, end]"},
        BadCase{"offsets_overlap",
                "tensor 'b': data_offsets [6, 12] overlap tensor 'a'"},
        BadCase{"gap_between_tensors",
                "tensor 'b': data_offsets [10, 16] leave a gap of 2 bytes"},
        BadCase{"data_not_covered",
                "the tensors cover 14 bytes of the 20-byte data section"},
        BadCase{"offsets_past_end",
                "tensor 'b': data_offsets [8, 14] run past the end"},
        BadCase{"misaligned_bits",
                "tensor 'a': 3 elements of F4 do not fill a whole number"},
        BadCase{"duplicate_names", "duplicate tensor name 'a'"},
        BadCase{"duplicate_field", "duplicate key 'dtype' in entry 'b'"},
        BadCase{"metadata_not_string",
                "__metadata__ value of 'k' is not a string"},
        BadCase{"metadata_not_object", "__metadata__ is not a JSON object"},
        BadCase{"invalid_utf8_name", "not valid JSON"},
        BadCase{"deep_nesting", "nested deeper than"}),
    [](const ::testing::TestParamInfo<BadCase>& info) {
      return std::string(info.param.file);
    });

std::string WithHeader(const std::string& header, size_t data_bytes,
                       uint64_t length) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i)
    out[i] = static_cast<char>((length >> (8 * i)) & 0xff);
  return out + header + std::string(data_bytes, '\0');
}

TEST(SafetensorsFileTest,
     HeaderOverTheCapIsRejectedEvenWhenTheFileIsLongEnough) {
  const uint64_t length = SafetensorsFile::kMaxHeaderBytes + 1;
  std::string bytes = WithHeader("", length, length);
  absl::StatusOr<SafetensorsFile> file =
      SafetensorsFile::Parse("big", bytes.data(), bytes.size());
  EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(file.status().message(),
              HasSubstr("exceeds the limit of 100000000 bytes"));
}

TEST(SafetensorsFileTest, ByteOrderMarkIsRejectedButTrailingSpaceIsNot) {
  // Both as the official reader: serde_json rejects a BOM; the writer pads
  // headers with spaces.
  const std::string bom = WithHeader("\xEF\xBB\xBF{}", 0, 5);
  absl::StatusOr<SafetensorsFile> file =
      SafetensorsFile::Parse("bom", bom.data(), bom.size());
  EXPECT_THAT(file.status().message(), HasSubstr("byte-order mark"));
  const std::string padded = WithHeader(" {}\n\t ", 0, 6);
  EXPECT_TRUE(SafetensorsFile::Parse("pad", padded.data(), padded.size()).ok());
}

TEST(SafetensorsFileTest, EmptyHeaderObjectAndZeroSizedTensorsAreValid) {
  const std::string empty = WithHeader("{}", 0, 2);
  absl::StatusOr<SafetensorsFile> file =
      SafetensorsFile::Parse("e", empty.data(), empty.size());
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE(file->tensors().empty());

  // A zero-sized tensor may share its offset with the tensor that follows it.
  const std::string header =
      R"({"z":{"dtype":"BF16","shape":[5,0],"data_offsets":[0,0]},)"
      R"("a":{"dtype":"F16","shape":[1],"data_offsets":[0,2]},"__metadata__":null})";
  const std::string bytes = WithHeader(header, 2, header.size());
  file = SafetensorsFile::Parse("z", bytes.data(), bytes.size());
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ(file->tensors().size(), 2u);
  EXPECT_EQ(file->tensors()[0].name, "z");
  EXPECT_EQ(file->tensors()[0].num_elements, 0);
  EXPECT_TRUE(file->ToFloat(file->tensors()[0], nullptr, 0).ok());
}

TEST(SafetensorsFileTest, UnalignedDataConvertsCorrectly) {
  // An odd header length puts the data section at an odd address.
  std::string header =
      R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  if (header.size() % 2 == 0) header += " ";
  std::string bytes = WithHeader(header, 0, header.size());
  const float want[2] = {1.5f, -2.25f};
  bytes.append(reinterpret_cast<const char*>(want), sizeof(want));
  absl::StatusOr<SafetensorsFile> file =
      SafetensorsFile::Parse("u", bytes.data(), bytes.size());
  ASSERT_TRUE(file.ok()) << file.status();
  float got[2];
  ASSERT_TRUE(file->ToFloat(file->tensors()[0], got, 2).ok());
  EXPECT_EQ(got[0], 1.5f);
  EXPECT_EQ(got[1], -2.25f);
}

}  // namespace
}  // namespace kvd::ops
