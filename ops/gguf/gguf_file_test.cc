// GgufFile and GgufWriter against independent references:
//  - files written by the Python gguf package's GGUFWriter
//    (ops/gguf/testdata/python_writer*), whose contents are described by JSON
//    written by the same script (tools/reference/make_dequant_golden.py): the
//    reader must report exactly those contents, and GgufWriter must reproduce
//    the Python-written file byte for byte;
//  - the two real model files (skipped when absent), with facts and
//    dequantized rows read by the Python gguf reader
//    (tests/golden/dequant/real_model_rows.json).
#include "ops/gguf/gguf_file.h"

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "base/model_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/quant/dequant.h"
#include "kernels/quant/ggml_type.h"
#include "kernels/quant/half.h"
#include "nlohmann/json.hpp"
#include "ops/gguf/gguf_writer.h"

namespace kvd::ops {
namespace {

using ::kvd::kernels::GgmlType;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

nlohmann::json ReadJson(const std::string& path) {
  return nlohmann::json::parse(ReadFile(path));
}

std::string FromHex(const std::string& hex) {
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<char>(std::stoul(hex.substr(2 * i, 2), nullptr, 16));
  }
  return out;
}

uint32_t Bits32(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
uint64_t Bits64(double d) {
  uint64_t u;
  std::memcpy(&u, &d, 8);
  return u;
}
float F32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
double F64(uint64_t u) {
  double d;
  std::memcpy(&d, &u, 8);
  return d;
}

std::vector<float> FloatsFromHex(const std::string& hex) {
  const std::string bytes = FromHex(hex);
  std::vector<float> out(bytes.size() / 4);
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

// Checks one parsed metadata value against its JSON description.
void ExpectValueMatches(const GgufFile& file, const nlohmann::json& kv) {
  const std::string key = kv["key"];
  SCOPED_TRACE(key);
  const GgufValue* v = file.Find(key);
  ASSERT_NE(v, nullptr);
  const std::string type = kv["type"];
  if (type == "string") {
    EXPECT_EQ(v->type(), GgufValueType::kString);
    EXPECT_EQ(std::string(v->AsString()), FromHex(kv["hex"]));
    EXPECT_EQ(std::string(*file.GetString(key)), FromHex(kv["hex"]));
  } else if (type == "float32") {
    EXPECT_EQ(v->type(), GgufValueType::kFloat32);
    EXPECT_EQ(Bits32(*file.GetFloat(key)), kv["bits"].get<uint32_t>());
  } else if (type == "float64") {
    EXPECT_EQ(v->type(), GgufValueType::kFloat64);
    EXPECT_EQ(Bits64(v->AsDouble()), kv["bits"].get<uint64_t>());
  } else if (type == "bool") {
    EXPECT_EQ(v->type(), GgufValueType::kBool);
    EXPECT_EQ(*file.GetBool(key), kv["value"].get<bool>());
  } else if (type[0] == 'u') {
    EXPECT_EQ(GgufValueTypeName(v->type()), type);
    EXPECT_EQ(*file.GetUint64(key), kv["value"].get<uint64_t>());
  } else if (type[0] == 'i') {
    EXPECT_EQ(GgufValueTypeName(v->type()), type);
    EXPECT_EQ(*file.GetInt64(key), kv["value"].get<int64_t>());
  } else {
    ASSERT_EQ(type, "array");
    ASSERT_EQ(v->type(), GgufValueType::kArray);
    const std::string elem = kv["elem"];
    EXPECT_EQ(GgufValueTypeName(v->array_type()), elem);
    if (elem == "string") {
      auto strs = file.GetStringArray(key);
      ASSERT_TRUE(strs.ok()) << strs.status();
      ASSERT_EQ(strs->size(), kv["hex"].size());
      for (size_t i = 0; i < strs->size(); ++i) {
        EXPECT_EQ(std::string((*strs)[i]), FromHex(kv["hex"][i]));
      }
    } else if (elem == "float32" || elem == "float64") {
      ASSERT_EQ(v->array_size(), kv["bits"].size());
      for (size_t i = 0; i < v->array_size(); ++i) {
        if (elem == "float32") {
          EXPECT_EQ(Bits32(static_cast<float>(v->ArrayDouble(i))),
                    kv["bits"][i].get<uint32_t>());
        } else {
          EXPECT_EQ(Bits64(v->ArrayDouble(i)), kv["bits"][i].get<uint64_t>());
        }
      }
    } else {
      ASSERT_EQ(v->array_size(), kv["values"].size());
      for (size_t i = 0; i < v->array_size(); ++i) {
        if (elem == "bool") {
          EXPECT_EQ(v->ArrayUint64(i) != 0, kv["values"][i].get<bool>());
        } else if (elem[0] == 'u') {
          EXPECT_EQ(v->ArrayUint64(i), kv["values"][i].get<uint64_t>());
        } else {
          EXPECT_EQ(v->ArrayInt64(i), kv["values"][i].get<int64_t>());
        }
      }
    }
  }
}

// Feeds the JSON description to GgufWriter, the way the Python script fed
// GGUFWriter.
GgufWriter WriterFromJson(const nlohmann::json& desc) {
  GgufWriter w(desc["alignment"].get<uint64_t>());
  for (const auto& kv : desc["kv"]) {
    const std::string key = kv["key"];
    const std::string type = kv["type"];
    if (type == "string") {
      w.AddString(key, FromHex(kv["hex"]));
    } else if (type == "uint8") {
      w.AddUint8(key, kv["value"].get<uint8_t>());
    } else if (type == "int8") {
      w.AddInt8(key, kv["value"].get<int8_t>());
    } else if (type == "uint16") {
      w.AddUint16(key, kv["value"].get<uint16_t>());
    } else if (type == "int16") {
      w.AddInt16(key, kv["value"].get<int16_t>());
    } else if (type == "uint32") {
      w.AddUint32(key, kv["value"].get<uint32_t>());
    } else if (type == "int32") {
      w.AddInt32(key, kv["value"].get<int32_t>());
    } else if (type == "uint64") {
      w.AddUint64(key, kv["value"].get<uint64_t>());
    } else if (type == "int64") {
      w.AddInt64(key, kv["value"].get<int64_t>());
    } else if (type == "bool") {
      w.AddBool(key, kv["value"].get<bool>());
    } else if (type == "float32") {
      w.AddFloat32(key, F32(kv["bits"].get<uint32_t>()));
    } else if (type == "float64") {
      w.AddFloat64(key, F64(kv["bits"].get<uint64_t>()));
    } else {
      const std::string elem = kv["elem"];
      if (elem == "string") {
        std::vector<std::string> s;
        for (const auto& h : kv["hex"]) s.push_back(FromHex(h));
        w.AddStringArray(key, s);
      } else if (elem == "float32") {
        std::vector<float> f;
        for (const auto& b : kv["bits"]) f.push_back(F32(b.get<uint32_t>()));
        w.AddFloat32Array(key, f);
      } else if (elem == "float64") {
        std::vector<double> f;
        for (const auto& b : kv["bits"]) f.push_back(F64(b.get<uint64_t>()));
        w.AddArray<double>(key, f);
      } else if (elem == "bool") {
        w.AddBoolArray(key, kv["values"].get<std::vector<bool>>());
      } else if (elem == "uint8") {
        w.AddArray<uint8_t>(key, kv["values"].get<std::vector<uint8_t>>());
      } else if (elem == "int8") {
        w.AddArray<int8_t>(key, kv["values"].get<std::vector<int8_t>>());
      } else if (elem == "uint16") {
        w.AddArray<uint16_t>(key, kv["values"].get<std::vector<uint16_t>>());
      } else if (elem == "int16") {
        w.AddArray<int16_t>(key, kv["values"].get<std::vector<int16_t>>());
      } else if (elem == "uint32") {
        w.AddArray<uint32_t>(key, kv["values"].get<std::vector<uint32_t>>());
      } else if (elem == "int32") {
        w.AddInt32Array(key, kv["values"].get<std::vector<int32_t>>());
      } else if (elem == "uint64") {
        w.AddArray<uint64_t>(key, kv["values"].get<std::vector<uint64_t>>());
      } else if (elem == "int64") {
        w.AddArray<int64_t>(key, kv["values"].get<std::vector<int64_t>>());
      }
    }
  }
  for (const auto& t : desc["tensors"]) {
    const std::string name = t["name"];
    const std::vector<int64_t> dims = t["dims"].get<std::vector<int64_t>>();
    const std::string type = t["type"];
    const std::string data = FromHex(t["data_hex"]);
    if (type == "F32") {
      w.AddTensorF32(name, dims, FloatsFromHex(t["data_hex"]));
    } else if (type == "F16") {
      w.AddTensorF16(name, dims, FloatsFromHex(t["source_f32_hex"]));
    } else if (type == "BF16") {
      w.AddTensorBF16(name, dims, FloatsFromHex(t["source_f32_hex"]));
    } else {
      w.AddTensorRaw(
          name, static_cast<GgmlType>(t["type_id"].get<uint32_t>()), dims,
          absl::Span<const uint8_t>(
              reinterpret_cast<const uint8_t*>(data.data()), data.size()));
    }
  }
  return w;
}

class PythonWrittenFileTest : public ::testing::TestWithParam<std::string> {};

TEST_P(PythonWrittenFileTest, ReaderReportsExactlyWhatPythonWrote) {
  const std::string base = "ops/gguf/testdata/" + GetParam();
  const nlohmann::json desc = ReadJson(base + ".json");
  auto file = GgufFile::Open(base + ".gguf");
  ASSERT_TRUE(file.ok()) << file.status();
  const GgufFile& f = **file;
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), desc["alignment"].get<uint64_t>());
  EXPECT_EQ(f.architecture(), "testarch");
  ASSERT_EQ(f.metadata().size(), desc["kv"].size());
  for (size_t i = 0; i < desc["kv"].size(); ++i) {
    EXPECT_EQ(std::string(f.metadata()[i].first),
              desc["kv"][i]["key"].get<std::string>());
    ExpectValueMatches(f, desc["kv"][i]);
  }
  ASSERT_EQ(f.tensors().size(), desc["tensors"].size());
  EXPECT_EQ(f.data_section_offset() % f.alignment(), 0u);
  for (size_t i = 0; i < f.tensors().size(); ++i) {
    const GgufTensor& t = f.tensors()[i];
    const auto& want = desc["tensors"][i];
    SCOPED_TRACE(t.name);
    EXPECT_EQ(t.name, want["name"].get<std::string>());
    EXPECT_EQ(static_cast<uint32_t>(t.type), want["type_id"].get<uint32_t>());
    EXPECT_EQ(kernels::GgmlTypeName(t.type), want["type"].get<std::string>());
    EXPECT_EQ(t.dims, want["dims"].get<std::vector<int64_t>>());
    const std::string data = FromHex(want["data_hex"]);
    ASSERT_EQ(t.size_bytes, data.size());
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(t.data), t.size_bytes),
              data);
    EXPECT_EQ(t.offset % f.alignment(), 0u);
    EXPECT_EQ(f.FindTensor(t.name), &t);
  }
}

TEST_P(PythonWrittenFileTest, WriterReproducesPythonFileByteForByte) {
  const std::string base = "ops/gguf/testdata/" + GetParam();
  const nlohmann::json desc = ReadJson(base + ".json");
  GgufWriter w = WriterFromJson(desc);
  ASSERT_TRUE(w.status().ok()) << w.status();
  auto bytes = w.WriteToString();
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  const std::string want = ReadFile(base + ".gguf");
  ASSERT_EQ(bytes->size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ((*bytes)[i], want[i]) << "first difference at byte " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Files, PythonWrittenFileTest,
                         ::testing::Values("python_writer",
                                           "python_writer_align64"));

TEST(GgufWriterTest, RoundTripsEdgeCasesThroughAFile) {
  GgufWriter w(64);
  w.AddString("general.architecture", "edge");
  w.AddFloat32("nan", std::numeric_limits<float>::quiet_NaN());
  w.AddFloat64("inf", -std::numeric_limits<double>::infinity());
  w.AddString("nul", std::string("a\0b", 3));
  w.AddStringArray("empty_strs", std::vector<std::string>{});
  w.AddArray<int64_t>("empty_i64", std::vector<int64_t>{});
  w.AddBoolArray("bools", {true, false, false, true});
  w.AddInt32Array(
      "ints", std::vector<int32_t>{std::numeric_limits<int32_t>::min(), 0, 7});
  w.AddArray<uint32_t>("big_u32", std::vector<uint32_t>{4000000000u});
  w.AddStringArray("strs", {"x", "", "yz"});
  const std::vector<float> vals = {1.0f, -0.1f, 65504.0f, 1e-8f, 3.0f, 0.333f};
  w.AddTensorF16("h", {3, 2}, vals);
  w.AddTensorBF16("b", {6}, vals);
  w.AddTensorF32("f", {2, 1, 3}, vals);
  ASSERT_TRUE(w.status().ok()) << w.status();
  const std::string path =
      std::string(std::getenv("TEST_TMPDIR")) + "/edge.gguf";
  ASSERT_TRUE(w.WriteToFile(path).ok());

  auto file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  const GgufFile& f = **file;
  EXPECT_EQ(f.path(), path);
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_EQ(*f.GetUint64("general.alignment"), 64u);
  EXPECT_TRUE(std::isnan(*f.GetFloat("nan")));
  EXPECT_TRUE(std::isinf(f.Find("inf")->AsDouble()));
  EXPECT_EQ(std::string(*f.GetString("nul")), std::string("a\0b", 3));
  EXPECT_TRUE(f.GetStringArray("empty_strs")->empty());
  EXPECT_EQ(f.Find("empty_i64")->array_size(), 0u);
  EXPECT_TRUE(f.GetInt32Array("empty_i64")->empty());
  EXPECT_THAT(f.GetInt32Array("bools").status().message(),
              HasSubstr("array<bool>"));
  EXPECT_EQ(f.Find("bools")->ArrayUint64(3), 1u);
  EXPECT_EQ(f.Find("bools")->ArrayUint64(1), 0u);
  EXPECT_THAT(*f.GetInt32Array("ints"),
              ElementsAre(std::numeric_limits<int32_t>::min(), 0, 7));
  EXPECT_THAT(f.GetInt32Array("big_u32").status().message(),
              HasSubstr("does not fit in int32"));
  auto strs = f.GetStringArray("strs");
  ASSERT_EQ(strs->size(), 3u);
  EXPECT_EQ((*strs)[2], "yz");

  ASSERT_EQ(f.tensors().size(), 3u);
  for (const GgufTensor& t : f.tensors()) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % 64, 0u)
        << t.name;  // mmap is page-aligned
    std::vector<float> got(6);
    ASSERT_TRUE(
        kernels::DequantizeRow(t.type, t.data, t.size_bytes, got.data(), 6)
            .ok());
    for (int i = 0; i < 6; ++i) {
      float want = vals[i];
      if (t.type == GgmlType::kF16)
        want = kernels::Fp16ToFp32(kernels::Fp32ToFp16(vals[i]));
      if (t.type == GgmlType::kBF16)
        want = kernels::Bf16ToFp32(kernels::Fp32ToBf16(vals[i]));
      EXPECT_EQ(Bits32(got[i]), Bits32(want)) << t.name << "[" << i << "]";
    }
  }
  EXPECT_EQ(f.FindTensor("f")->num_rows(), 3);
  EXPECT_EQ(f.FindTensor("f")->row_bytes(), 8u);
  EXPECT_EQ(f.FindTensor("h")->dims, (std::vector<int64_t>{3, 2}));
}

TEST(GgufWriterTest, ReportsFirstError) {
  {
    GgufWriter w;
    w.AddUint32("k", 1);
    w.AddString("k", "again");
    w.AddUint32("", 2);
    EXPECT_THAT(w.status().message(), HasSubstr("duplicate metadata key 'k'"));
    EXPECT_EQ(w.WriteToString().status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  {
    GgufWriter w;
    w.AddTensorF32("t", {4, 2}, std::vector<float>(7));
    EXPECT_THAT(w.status().message(),
                HasSubstr("tensor 't' dims [4, 2] need 8 values, got 7"));
  }
  {
    GgufWriter w;
    w.AddTensorRaw("q", GgmlType::kQ8_0, {32}, std::vector<uint8_t>(33));
    EXPECT_THAT(w.status().message(), HasSubstr("needs 34 bytes, got 33"));
  }
  {
    GgufWriter w;
    w.AddTensorRaw("q", GgmlType::kQ4_K, {32}, std::vector<uint8_t>(144));
    EXPECT_THAT(w.status().message(),
                HasSubstr("not a multiple of the Q4_K block size 256"));
  }
  {
    GgufWriter w;
    w.AddTensorF32("t", {1}, std::vector<float>(1));
    w.AddTensorF32("t", {1}, std::vector<float>(1));
    EXPECT_THAT(w.status().message(), HasSubstr("duplicate tensor name 't'"));
  }
  {
    GgufWriter w;
    w.AddTensorF32("t", {0}, {});
    EXPECT_THAT(w.status().message(), HasSubstr("invalid dims [0]"));
  }
  EXPECT_THAT(GgufWriter(48).status().message(), HasSubstr("alignment 48"));
  {
    GgufWriter w(64);
    w.AddUint32("general.alignment", 32);
    EXPECT_THAT(w.status().message(),
                HasSubstr("differs from the writer's alignment 64"));
  }
}

class GetterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    GgufWriter w;
    w.AddString("s", "text");
    w.AddInt32("neg", -3);
    w.AddInt8("pos_i8", 5);
    w.AddUint64("huge", std::numeric_limits<uint64_t>::max());
    w.AddUint16("u16", 7);
    w.AddFloat64("f64", 0.1);
    w.AddBool("b", true);
    w.AddArray<double>("f64s", std::vector<double>{0.5, 0.1});
    w.AddArray<int64_t>("i64s", std::vector<int64_t>{1, int64_t{1} << 40});
    w.AddStringArray("strs", {"a"});
    auto bytes = w.WriteToString();
    ASSERT_TRUE(bytes.ok());
    bytes_ = *bytes;
    auto f = GgufFile::Parse("g.gguf",
                             reinterpret_cast<const uint8_t*>(bytes_.data()),
                             bytes_.size());
    ASSERT_TRUE(f.ok()) << f.status();
    file_ = std::move(*f);
  }
  std::string bytes_;
  std::unique_ptr<GgufFile> file_;
};

TEST_F(GetterTest, ConversionsAndErrors) {
  const GgufFile& f = *file_;
  EXPECT_EQ(*f.GetUint64("u16"), 7u);
  EXPECT_EQ(*f.GetUint64("pos_i8"), 5u);
  EXPECT_EQ(*f.GetInt64("u16"), 7);
  EXPECT_EQ(*f.GetInt64("neg"), -3);
  EXPECT_EQ(*f.GetFloat("f64"), 0.1f);
  EXPECT_THAT(*f.GetFloatArray("f64s"), ElementsAre(0.5f, 0.1f));
  EXPECT_THAT(
      f.GetInt32Array("i64s").status().message(),
      HasSubstr("g.gguf: metadata key 'i64s' element 1 does not fit in int32"));

  auto missing = f.GetUint64("nope");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(),
              HasSubstr("g.gguf: metadata key 'nope' not found"));
  auto wrong = f.GetUint64("s");
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(wrong.status().message(),
              HasSubstr("g.gguf: metadata key 's' has type string, expected an "
                        "unsigned integer"));
  EXPECT_THAT(f.GetUint64("neg").status().message(), HasSubstr("is -3"));
  EXPECT_THAT(f.GetInt64("huge").status().message(),
              HasSubstr("does not fit in int64"));
  EXPECT_THAT(f.GetString("u16").status().message(),
              HasSubstr("has type uint16"));
  EXPECT_THAT(f.GetFloat("s").status().message(),
              HasSubstr("expected float32 or float64"));
  EXPECT_THAT(f.GetBool("u16").status().message(), HasSubstr("expected bool"));
  EXPECT_THAT(f.GetStringArray("f64s").status().message(),
              HasSubstr("has type array<float64>, expected array<string>"));
  EXPECT_THAT(f.GetFloatArray("strs").status().message(),
              HasSubstr("array<string>"));
  EXPECT_THAT(f.GetInt32Array("f64s").status().message(),
              HasSubstr("an array of integers"));

  EXPECT_EQ(*f.GetStringOr("nope", "dflt"), "dflt");
  EXPECT_EQ(*f.GetStringOr("s", "dflt"), "text");
  EXPECT_EQ(*f.GetUint64Or("nope", 9), 9u);
  EXPECT_EQ(*f.GetInt64Or("nope", -9), -9);
  EXPECT_EQ(*f.GetFloatOr("nope", 2.5f), 2.5f);
  EXPECT_EQ(*f.GetBoolOr("nope", false), false);
  EXPECT_EQ(*f.GetBoolOr("b", false), true);
  EXPECT_EQ(f.GetUint64Or("s", 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(f.architecture(), "");
  EXPECT_EQ(f.FindTensor("x"), nullptr);
  EXPECT_EQ(f.GetTensor("x").status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(f.GetTensor("x").status().message(),
              HasSubstr("g.gguf: tensor 'x' not found"));
}

std::string ModelPath(const std::string& file) {
  const std::vector<std::string> dirs = {ModelCacheDir()};
  for (const std::string& d : dirs) {
    const std::string p = d + "/" + file;
    if (std::ifstream(p).good()) return p;
  }
  return "";
}

std::map<std::string, int> TypeCounts(const GgufFile& f) {
  std::map<std::string, int> counts;
  for (const GgufTensor& t : f.tensors())
    ++counts[std::string(kernels::GgmlTypeName(t.type))];
  return counts;
}

// Checks rows against the Python gguf reader + dequantizer.
void ExpectRowsMatchPython(const GgufFile& f, const std::string& file_name) {
  const nlohmann::json golden =
      ReadJson("tests/golden/dequant/real_model_rows.json");
  int checked = 0;
  for (const auto& r : golden["rows"]) {
    if (r["file"] != file_name) continue;
    const std::string name = r["tensor"];
    SCOPED_TRACE(name + " row " + std::to_string(r["row"].get<int>()));
    const GgufTensor* t = f.FindTensor(name);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(kernels::GgmlTypeName(t->type), r["type"].get<std::string>());
    const int64_t n = r["row_length"];
    ASSERT_EQ(t->row_length(), n);
    const uint64_t row_bytes = t->row_bytes();
    std::vector<float> got(n);
    const uint8_t* src = t->data + r["row"].get<int64_t>() * row_bytes;
    ASSERT_TRUE(
        kernels::DequantizeRow(t->type, src, row_bytes, got.data(), n).ok());
    const std::vector<float> want = FloatsFromHex(r["expected_f32_hex"]);
    ASSERT_EQ(want.size(), got.size());
    int bad = 0;
    for (int64_t i = 0; i < n; ++i) bad += Bits32(got[i]) != Bits32(want[i]);
    EXPECT_EQ(bad, 0);
    ++checked;
  }
  EXPECT_GT(checked, 0);
}

// Facts below were read with gguf.GGUFReader (gguf 0.19.0) from the same files.
TEST(RealModelTest, SmolLM2) {
  const std::string path = ModelPath("SmolLM2-135M-Instruct.Q4_1.gguf");
  if (path.empty())
    FAIL() << "(run tools/setup.sh --test) "
           << "SmolLM2 model not cached; run tools/fetch_models.sh all";
  auto file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  const GgufFile& f = **file;
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.architecture(), "llama");
  EXPECT_EQ(f.metadata().size(), 33u);
  EXPECT_EQ(*f.GetUint64("llama.block_count"), 30u);
  EXPECT_EQ(*f.GetUint64("llama.embedding_length"), 576u);
  EXPECT_EQ(*f.GetUint64("llama.attention.head_count_kv"), 3u);
  EXPECT_EQ(*f.GetFloat("llama.rope.freq_base"), 100000.0f);
  EXPECT_EQ(*f.GetFloat("llama.attention.layer_norm_rms_epsilon"), 1e-5f);
  EXPECT_EQ(*f.GetString("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(*f.GetString("tokenizer.ggml.pre"), "smollm");
  EXPECT_EQ(*f.GetBool("tokenizer.ggml.add_bos_token"), false);
  EXPECT_EQ(*f.GetUint64("tokenizer.ggml.eos_token_id"), 2u);
  auto tokens = f.GetStringArray("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  ASSERT_EQ(tokens->size(), 49152u);
  EXPECT_EQ((*tokens)[0], "<|endoftext|>");
  EXPECT_EQ((*tokens)[1], "<|im_start|>");
  EXPECT_EQ((*tokens)[49151], "ectable");
  auto merges = f.GetStringArray("tokenizer.ggml.merges");
  ASSERT_EQ(merges->size(), 48900u);
  EXPECT_EQ((*merges)[0], "\xc4\xa0 t");  // "Ġ t"
  auto types = f.GetInt32Array("tokenizer.ggml.token_type");
  ASSERT_EQ(types->size(), 49152u);
  EXPECT_EQ((*types)[0], 3);
  EXPECT_EQ((*types)[49151], 1);
  ASSERT_EQ(f.tensors().size(), 272u);
  EXPECT_EQ(TypeCounts(f), (std::map<std::string, int>{
                               {"F32", 61}, {"Q4_1", 210}, {"Q8_0", 1}}));
  EXPECT_EQ(f.data_section_offset(), 1785664u);
  const GgufTensor* emb = f.FindTensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->type, GgmlType::kQ8_0);
  EXPECT_EQ(emb->dims, (std::vector<int64_t>{576, 49152}));
  EXPECT_EQ(emb->offset, 1785664u);
  EXPECT_EQ(emb->size_bytes, 30081024u);
  EXPECT_EQ(f.FindTensor("blk.0.attn_norm.weight")->offset, 31866688u);
  EXPECT_EQ(f.FindTensor("output_norm.weight")->offset, 98360128u);
  ExpectRowsMatchPython(f, "SmolLM2-135M-Instruct.Q4_1.gguf");
}

TEST(RealModelTest, Gemma3) {
  const std::string path = ModelPath("gemma-3-270m-q4_k_m.gguf");
  if (path.empty())
    FAIL() << "(run tools/setup.sh --test) "
           << "Gemma 3 model not cached; run tools/fetch_models.sh all";
  const auto start = std::chrono::steady_clock::now();
  auto file = GgufFile::Open(path);
  const double open_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  ASSERT_TRUE(file.ok()) << file.status();
  // 262144-entry vocabulary: views into the mapping, so opening takes
  // milliseconds. The bound is loose because test machines are shared.
  RecordProperty("open_seconds", std::to_string(open_s));
  EXPECT_LT(open_s, 2.0);
  const GgufFile& f = **file;
  EXPECT_EQ(f.architecture(), "gemma3");
  EXPECT_EQ(f.metadata().size(), 33u);
  EXPECT_EQ(*f.GetUint64("gemma3.block_count"), 18u);
  EXPECT_EQ(*f.GetUint64("gemma3.attention.sliding_window"), 512u);
  EXPECT_EQ(*f.GetUint64("gemma3.attention.key_length"), 256u);
  EXPECT_EQ(*f.GetFloat("gemma3.rope.freq_base"), 1000000.0f);
  EXPECT_EQ(*f.GetString("tokenizer.ggml.model"), "llama");
  EXPECT_EQ(*f.GetBool("tokenizer.ggml.add_bos_token"), true);
  EXPECT_EQ(*f.GetUint64("tokenizer.ggml.bos_token_id"), 2u);
  auto tokens = f.GetStringArray("tokenizer.ggml.tokens");
  ASSERT_EQ(tokens->size(), 262144u);
  EXPECT_EQ((*tokens)[0], "<pad>");
  EXPECT_EQ((*tokens)[1], "<eos>");
  EXPECT_EQ((*tokens)[262143], "<unused6241>");
  auto scores = f.GetFloatArray("tokenizer.ggml.scores");
  ASSERT_EQ(scores->size(), 262144u);
  EXPECT_EQ((*scores)[0], -1000.0f);
  ASSERT_EQ(f.GetInt32Array("tokenizer.ggml.token_type")->size(), 262144u);
  ASSERT_EQ(f.tensors().size(), 236u);
  EXPECT_EQ(TypeCounts(f), (std::map<std::string, int>{{"F32", 109},
                                                       {"Q5_0", 81},
                                                       {"Q4_K", 27},
                                                       {"Q8_0", 10},
                                                       {"Q6_K", 9}}));
  EXPECT_EQ(f.data_section_offset(), 6525120u);
  const GgufTensor* emb = f.FindTensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->dims, (std::vector<int64_t>{640, 262144}));
  EXPECT_EQ(emb->offset, 6527680u);
  EXPECT_EQ(f.FindTensor("blk.0.attn_k.weight")->offset, 184785600u);
  EXPECT_EQ(f.FindTensor("blk.0.attn_k.weight")->size_bytes, 112640u);
  ExpectRowsMatchPython(f, "gemma-3-270m-q4_k_m.gguf");
}

}  // namespace
}  // namespace kvd::ops
