#include "ops/model/fingerprint.h"

#include <openssl/evp.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace kvd::ops {
namespace {

namespace fs = std::filesystem;

struct MdCtxDeleter {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};
using MdCtx = std::unique_ptr<EVP_MD_CTX, MdCtxDeleter>;

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

// Feeds "<name>\0<size>\0<bytes>" so that moving bytes between files changes
// the digest.
absl::Status HashFile(EVP_MD_CTX* ctx, const fs::path& file) {
  std::error_code ec;
  const uintmax_t size = fs::file_size(file, ec);
  if (ec) {
    return absl::NotFoundError(absl::StrCat("fingerprint: cannot stat ",
                                            file.string(), ": ", ec.message()));
  }
  const std::string frame =
      absl::StrCat(file.filename().string(), std::string(1, '\0'), size,
                   std::string(1, '\0'));
  EVP_DigestUpdate(ctx, frame.data(), frame.size());
  std::unique_ptr<std::FILE, FileCloser> f(std::fopen(file.c_str(), "rb"));
  if (f == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("fingerprint: cannot open ", file.string()));
  }
  std::vector<char> buf(4 << 20);
  uintmax_t total = 0;
  while (true) {
    const size_t n = std::fread(buf.data(), 1, buf.size(), f.get());
    if (n == 0) break;
    EVP_DigestUpdate(ctx, buf.data(), n);
    total += n;
  }
  if (std::ferror(f.get()) || total != size) {
    return absl::UnavailableError(
        absl::StrCat("fingerprint: read ", total, " of ", size, " bytes of ",
                     file.string(), "; is the file being written?"));
  }
  return absl::OkStatus();
}

bool IsHfModelFile(const std::string& name) {
  return name == "config.json" || absl::StartsWith(name, "tokenizer") ||
         name == "special_tokens_map.json" ||
         name == "generation_config.json" ||
         absl::EndsWith(name, ".safetensors");
}

}  // namespace

absl::StatusOr<std::string> FingerprintModelFiles(const std::string& path) {
  std::error_code ec;
  std::vector<fs::path> files;
  if (fs::is_directory(path, ec)) {
    for (const fs::directory_entry& e : fs::directory_iterator(path, ec)) {
      if (e.is_regular_file() && IsHfModelFile(e.path().filename().string()))
        files.push_back(e.path());
    }
    if (ec) {
      return absl::UnavailableError(
          absl::StrCat("fingerprint: cannot list ", path, ": ", ec.message()));
    }
    std::sort(files.begin(), files.end());
    if (files.empty()) {
      return absl::NotFoundError(
          absl::StrCat("fingerprint: ", path,
                       " has no config.json, tokenizer or .safetensors files"));
    }
  } else {
    files.push_back(path);
  }
  MdCtx ctx(EVP_MD_CTX_new());
  if (ctx == nullptr ||
      EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1)
    return absl::InternalError("fingerprint: OpenSSL SHA-256 unavailable");
  for (const fs::path& f : files) {
    if (absl::Status s = HashFile(ctx.get(), f); !s.ok()) return s;
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx.get(), digest, &len);
  std::string hex = "sha256:";
  static constexpr char kHex[] = "0123456789abcdef";
  for (unsigned int i = 0; i < len; ++i) {
    hex.push_back(kHex[digest[i] >> 4]);
    hex.push_back(kHex[digest[i] & 15]);
  }
  return hex;
}

}  // namespace kvd::ops
