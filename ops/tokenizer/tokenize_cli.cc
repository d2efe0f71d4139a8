// tokenize_cli: runs a GGUF file's tokenizer over JSON-lines requests, one
// reply line each.
//
//   bazel-bin/ops/tokenizer/tokenize_cli MODEL.gguf REQUESTS.jsonl
//
// Requests: {"b64": <base64 text>, "add_special": bool, "parse_special": bool}
// -> {"ids": [...]}
//           {"decode": [ids], "special": bool} -> {"b64": <text>}
// Text travels as base64 so that arbitrary (also invalid UTF-8) bytes survive
// JSON. This is the kvd side of tools/reference/diff_tokenizer_llamacpp.py.
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "nlohmann/json.hpp"
#include "ops/gguf/gguf_file.h"
#include "ops/tokenizer/gguf_tokenizer.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: " << argv[0] << " MODEL.gguf REQUESTS.jsonl\n";
    return 2;
  }
  auto file = kvd::ops::GgufFile::Open(argv[1]);
  if (!file.ok()) {
    std::cerr << file.status() << "\n";
    return 1;
  }
  auto tok = kvd::ops::TokenizerFromGguf(**file);
  if (!tok.ok()) {
    std::cerr << tok.status() << "\n";
    return 1;
  }
  std::ifstream in(argv[2]);
  if (!in.good()) {
    std::cerr << "cannot read " << argv[2] << "\n";
    return 1;
  }
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    const nlohmann::json req =
        nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    nlohmann::json reply;
    if (req.is_object() && req.contains("decode")) {
      const std::vector<int32_t> ids = req["decode"];
      const std::string text = (*tok)->Decode(ids, req.value("special", false));
      reply["b64"] = absl::Base64Escape(text);
    } else if (req.is_object() && req.contains("b64")) {
      std::string text;
      if (!absl::Base64Unescape(req["b64"].get<std::string>(), &text)) {
        std::cerr << argv[2] << ":" << line_no << ": bad base64\n";
        return 1;
      }
      reply["ids"] = (*tok)->Encode(text, req.value("add_special", false),
                                    req.value("parse_special", false));
    } else {
      std::cerr << argv[2] << ":" << line_no
                << ": expected {\"b64\":...} or {\"decode\":...}\n";
      return 1;
    }
    std::cout << reply.dump() << "\n";
  }
  return 0;
}
