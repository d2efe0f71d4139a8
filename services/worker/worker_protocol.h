// What the CPU tensor-parallel leader (shard_group.h) and its shard workers
// (shard_worker.h) both need to speak proto/kvd/v1/shard_worker.proto:
// residual rows and token ids as bytes, a status and its wire form, and the
// twin caches a worker applies the leader's cache calls to.
#ifndef KVD_SERVICES_WORKER_WORKER_PROTOCOL_H_
#define KVD_SERVICES_WORKER_WORKER_PROTOCOL_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "ops/model/kv_block_pool.h"
#include "ops/model/kv_cache.h"
#include "ops/model/model_config.h"
#include "proto/kvd/v1/shard_worker.pb.h"

namespace kvd::worker {

// Cache op kinds beyond ops::KvCacheOp's: a new cache (value: its pool's
// block rows) and a cache that is gone.
inline constexpr int32_t kCacheCreated = 0;
inline constexpr int32_t kCacheDropped = -1;

// `n` rows of `d` values: as bf16 when every value is exactly one (nothing
// is lost), else as fp32.
void EncodeResiduals(const float* rows, int64_t n, int64_t d,
                     v1::ResidualRows* out);
// INVALID_ARGUMENT unless the message holds exactly n x d values.
absl::Status DecodeResiduals(const v1::ResidualRows& in, int64_t n, int64_t d,
                             std::vector<float>* out);

std::string EncodeTokens(absl::Span<const int32_t> tokens);
absl::StatusOr<std::vector<int32_t>> DecodeTokens(const std::string& bytes);

void SetReplyStatus(const absl::Status& status, v1::WorkerReply* reply);
absl::Status ReplyStatus(const v1::WorkerReply& reply);

// A worker's twins of the leader's caches, by the leader's cache id, each in
// an unlimited pool of the leader's block size for it.
class TwinCaches {
 public:
  TwinCaches(const ops::ModelConfig& shard_config, ops::Precision precision)
      : config_(shard_config), precision_(precision) {}

  // FAILED_PRECONDITION for a cache the leader never created here (the two
  // sides disagree: the shard group must be rebuilt).
  absl::Status Apply(const v1::CacheOp& op);
  absl::StatusOr<ops::KvCache*> Find(uint64_t id);
  int64_t size() const { return static_cast<int64_t>(caches_.size()); }
  size_t kv_bytes() const;

 private:
  const ops::ModelConfig config_;
  const ops::Precision precision_;
  std::map<int64_t, std::unique_ptr<ops::KvBlockPool>> pools_;  // by rows
  std::map<uint64_t, std::unique_ptr<ops::KvCache>> caches_;
};

}  // namespace kvd::worker

#endif  // KVD_SERVICES_WORKER_WORKER_PROTOCOL_H_
