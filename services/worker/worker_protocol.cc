#include "services/worker/worker_protocol.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace kvd::worker {

void EncodeResiduals(const float* rows, int64_t n, int64_t d,
                     v1::ResidualRows* out) {
  const int64_t count = n * d;
  bool bf16 = true;
  for (int64_t i = 0; i < count && bf16; ++i) {
    uint32_t bits;
    std::memcpy(&bits, rows + i, 4);
    bf16 = (bits & 0xffffu) == 0;
  }
  out->set_bf16(bf16);
  std::string* data = out->mutable_data();
  if (!bf16) {
    data->assign(reinterpret_cast<const char*>(rows), count * 4);
    return;
  }
  data->resize(count * 2);
  char* dst = data->data();
  for (int64_t i = 0; i < count; ++i) {
    uint32_t bits;
    std::memcpy(&bits, rows + i, 4);
    const uint16_t high = static_cast<uint16_t>(bits >> 16);
    std::memcpy(dst + 2 * i, &high, 2);
  }
}

absl::Status DecodeResiduals(const v1::ResidualRows& in, int64_t n, int64_t d,
                             std::vector<float>* out) {
  const int64_t count = n * d;
  const int64_t width = in.bf16() ? 2 : 4;
  if (n < 0 || static_cast<int64_t>(in.data().size()) != count * width) {
    return absl::InvalidArgumentError(
        absl::StrCat("residual rows: ", in.data().size(), " bytes for ", n,
                     " rows of ", d, " values"));
  }
  out->resize(count);
  const char* src = in.data().data();
  if (!in.bf16()) {
    std::memcpy(out->data(), src, count * 4);
    return absl::OkStatus();
  }
  for (int64_t i = 0; i < count; ++i) {
    uint16_t high;
    std::memcpy(&high, src + 2 * i, 2);
    const uint32_t bits = uint32_t{high} << 16;
    std::memcpy(out->data() + i, &bits, 4);
  }
  return absl::OkStatus();
}

std::string EncodeTokens(absl::Span<const int32_t> tokens) {
  return std::string(reinterpret_cast<const char*>(tokens.data()),
                     tokens.size() * sizeof(int32_t));
}

absl::StatusOr<std::vector<int32_t>> DecodeTokens(const std::string& bytes) {
  if (bytes.size() % sizeof(int32_t) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("token ids: ", bytes.size(), " bytes"));
  }
  std::vector<int32_t> tokens(bytes.size() / sizeof(int32_t));
  std::memcpy(tokens.data(), bytes.data(), bytes.size());
  return tokens;
}

void SetReplyStatus(const absl::Status& status, v1::WorkerReply* reply) {
  reply->set_code(static_cast<int32_t>(status.code()));
  reply->set_message(std::string(status.message()));
}

absl::Status ReplyStatus(const v1::WorkerReply& reply) {
  if (reply.code() == 0) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(reply.code()),
                      reply.message());
}

absl::Status TwinCaches::Apply(const v1::CacheOp& op) {
  if (op.kind() == kCacheCreated) {
    const int64_t rows = op.value();
    std::unique_ptr<ops::KvBlockPool>& pool = pools_[rows];
    if (pool == nullptr) {
      ops::KvBlockPool::Options o;
      o.block_rows = rows;
      absl::StatusOr<std::unique_ptr<ops::KvBlockPool>> made =
          ops::KvBlockPool::Create(ops::KvCache::RowBytes(config_, precision_),
                                   o);
      if (!made.ok()) return made.status();
      pool = *std::move(made);
    }
    absl::StatusOr<ops::KvCache> cache =
        ops::KvCache::InPool(config_, precision_, pool.get());
    if (!cache.ok()) return cache.status();
    caches_[op.cache()] = std::make_unique<ops::KvCache>(*std::move(cache));
    return absl::OkStatus();
  }
  if (op.kind() == kCacheDropped) {
    caches_.erase(op.cache());
    return absl::OkStatus();
  }
  absl::StatusOr<ops::KvCache*> found = Find(op.cache());
  if (!found.ok()) return found.status();
  ops::KvCache& c = **found;
  if (op.layer() < -1 || op.layer() >= c.n_layers()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cache op on layer ", op.layer()));
  }
  switch (op.kind()) {
    case ops::KvCacheOp::kTruncate:
      c.Truncate(op.value());
      return absl::OkStatus();
    case ops::KvCacheOp::kReset:
      c.Reset(op.value());
      return absl::OkStatus();
    case ops::KvCacheOp::kDropBelow:
      if (op.layer() < 0) {
        c.DropBelow(op.value());
      } else {
        c.DropBelow(op.layer(), op.value());
      }
      return absl::OkStatus();
    case ops::KvCacheOp::kReserve:
      return op.layer() < 0 ? c.Reserve(op.value())
                            : c.ReserveLayer(op.layer(), op.value());
    case ops::KvCacheOp::kSetLength:
      c.SetLength(op.value());
      return absl::OkStatus();
    case ops::KvCacheOp::kKeepPastWindow:
      c.KeepRowsPastWindows();
      return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown cache op kind ", op.kind()));
}

absl::StatusOr<ops::KvCache*> TwinCaches::Find(uint64_t id) {
  auto it = caches_.find(id);
  if (it == caches_.end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard worker: no twin of the leader's cache ", id,
        " (the leader and this worker disagree; the shard group must be "
        "restarted)"));
  }
  return it->second.get();
}

size_t TwinCaches::kv_bytes() const {
  size_t bytes = 0;
  for (const auto& [id, cache] : caches_) bytes += cache->allocated_bytes();
  return bytes;
}

}  // namespace kvd::worker
