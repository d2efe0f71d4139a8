#include "storage/rocksdb/keys.h"

#include "absl/strings/str_cat.h"

namespace kvd::storage {
namespace {

constexpr size_t kIdBytes = 16;

void PutBigEndian64(std::string* out, uint64_t v) {
  for (int shift = 56; shift >= 0; shift -= 8) {
    out->push_back(static_cast<char>((v >> shift) & 0xFF));
  }
}

uint64_t GetBigEndian64(absl::string_view in) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | static_cast<uint8_t>(in[i]);
  return v;
}

constexpr uint64_t kSignBit = uint64_t{1} << 63;

}  // namespace

std::string SessionKey(absl::string_view tenant, absl::string_view session) {
  return absl::StrCat(tenant, "/", session);
}

std::string TenantPrefix(absl::string_view tenant) {
  return absl::StrCat(tenant, "/");
}

std::string ChunkPrefix(absl::string_view tenant, absl::string_view session) {
  return absl::StrCat(tenant, "/", session, "/");
}

std::string ChunkKey(absl::string_view tenant, absl::string_view session,
                     const ChunkId& id) {
  std::string key = ChunkPrefix(tenant, session);
  PutBigEndian64(&key, static_cast<uint64_t>(id.layer) ^ kSignBit);
  PutBigEndian64(&key, static_cast<uint64_t>(id.index));
  return key;
}

std::optional<ParsedChunkKey> ParseChunkKey(absl::string_view key) {
  if (key.size() < kIdBytes + 4) return std::nullopt;
  ParsedChunkKey p;
  p.prefix = key.substr(0, key.size() - kIdBytes);
  if (p.prefix.back() != '/') return std::nullopt;
  const absl::string_view names = p.prefix.substr(0, p.prefix.size() - 1);
  const size_t slash = names.find('/');
  if (slash == absl::string_view::npos || slash == 0 ||
      slash + 1 == names.size() ||
      names.find('/', slash + 1) != absl::string_view::npos) {
    return std::nullopt;
  }
  p.tenant = names.substr(0, slash);
  p.session = names.substr(slash + 1);
  const absl::string_view id = key.substr(key.size() - kIdBytes);
  p.id.layer = static_cast<int64_t>(GetBigEndian64(id) ^ kSignBit);
  const uint64_t index = GetBigEndian64(id.substr(8));
  if (index > static_cast<uint64_t>(INT64_MAX)) return std::nullopt;
  p.id.index = static_cast<int64_t>(index);
  return p;
}

std::string PrefixUpperBound(absl::string_view prefix) {
  std::string bound(prefix);
  bound.back() = static_cast<char>(bound.back() + 1);
  return bound;
}

}  // namespace kvd::storage
