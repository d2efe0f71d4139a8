#include "ops/model/kv_cache.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/elementwise.h"

namespace kvd::ops {

using kernels::cpu::kAttentionChunk;
using kernels::cpu::WeightType;

namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A cache's own pool: unlimited, and released blocks go back to the
// allocator, so a windowed cache's memory shrinks as it slides.
std::shared_ptr<KvBlockPool> PrivatePool(size_t row_bytes, int64_t block_rows) {
  KvBlockPool::Options options;
  options.block_rows = block_rows;
  options.retain_free_blocks = false;
  // Cannot fail: the row size is positive and block_rows a chunk multiple.
  return std::shared_ptr<KvBlockPool>(
      KvBlockPool::Create(std::max<size_t>(row_bytes, 1), options)
          .value()
          .release());
}

}  // namespace

int64_t WindowStart(int64_t sliding_window, int64_t length) {
  if (sliding_window <= 0) return 0;
  const int64_t first = std::max<int64_t>(0, length - sliding_window + 1);
  return first / kAttentionChunk * kAttentionChunk;
}

size_t KvCache::RowBytes(const ModelConfig& config, Precision precision) {
  return config.kv_dim() * (precision == Precision::kF32 ? 4 : 2);
}

KvCache::KvCache(const ModelConfig& config, Precision precision,
                 KvBlockPool* pool, std::shared_ptr<KvBlockPool> own_pool)
    : precision_(precision),
      row_size_(config.kv_dim()),
      elem_bytes_(precision == Precision::kF32 ? 4 : 2),
      own_pool_(std::move(own_pool)),
      pool_(pool != nullptr ? pool : own_pool_.get()),
      block_rows_(pool_->block_rows()),
      layers_(config.n_layers) {}

KvCache::KvCache(const ModelConfig& config, Precision precision)
    : KvCache(config, precision, nullptr,
              PrivatePool(RowBytes(config, precision),
                          KvBlockPool::kDefaultBlockRows)) {}

absl::StatusOr<KvCache> KvCache::InPool(const ModelConfig& config,
                                        Precision precision,
                                        KvBlockPool* pool) {
  if (pool == nullptr)
    return absl::InvalidArgumentError("K/V cache: null block pool");
  const size_t row_bytes = RowBytes(config, precision);
  if (pool->row_bytes() != row_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "K/V cache: the block pool holds ", pool->row_bytes(),
        "-byte rows but model ", config.name, " in ", PrecisionName(precision),
        " needs ", row_bytes, "; make one pool per model and precision"));
  }
  return KvCache(config, precision, pool, nullptr);
}

KvCache::KvCache(const KvCache& other)
    : precision_(other.precision_),
      row_size_(other.row_size_),
      elem_bytes_(other.elem_bytes_),
      own_pool_(PrivatePool(other.row_bytes(), other.block_rows_)),
      pool_(own_pool_.get()),
      block_rows_(other.block_rows_),
      length_(other.length_),
      trims_past_windows_(other.trims_past_windows_),
      layers_(other.layers_) {
  other.CheckHostAccess("copying a KvCache");
  const size_t bytes = pool_->block_bytes();
  for (LayerBlocks& l : layers_) {
    for (uint8_t*& b : l.blocks) {
      if (b == nullptr) continue;
      uint8_t* copy = pool_->Take();
      std::memcpy(copy, b, bytes);
      b = copy;
    }
  }
}

KvCache& KvCache::operator=(const KvCache& other) {
  if (this != &other) *this = KvCache(other);
  return *this;
}

KvCache::KvCache(KvCache&& other) noexcept
    : precision_(other.precision_),
      row_size_(other.row_size_),
      elem_bytes_(other.elem_bytes_),
      own_pool_(other.own_pool_),  // copied: `other` stays usable
      pool_(other.pool_),
      block_rows_(other.block_rows_),
      length_(other.length_),
      trims_past_windows_(other.trims_past_windows_),
      layers_(std::move(other.layers_)),
      mirror_(std::move(other.mirror_)) {
  other.layers_.assign(layers_.size(), LayerBlocks{});
  other.length_ = 0;
}

KvCache& KvCache::operator=(KvCache&& other) noexcept {
  if (this == &other) return *this;
  ReleaseAll();
  precision_ = other.precision_;
  row_size_ = other.row_size_;
  elem_bytes_ = other.elem_bytes_;
  own_pool_ = other.own_pool_;
  pool_ = other.pool_;
  block_rows_ = other.block_rows_;
  length_ = other.length_;
  trims_past_windows_ = other.trims_past_windows_;
  layers_ = std::move(other.layers_);
  mirror_ = std::move(other.mirror_);
  other.layers_.assign(layers_.size(), LayerBlocks{});
  other.length_ = 0;
  return *this;
}

KvCache::~KvCache() { ReleaseAll(); }

void KvCache::ReleaseAll() {
  for (LayerBlocks& l : layers_) {
    for (uint8_t* b : l.blocks) pool_->Release(b);
    l.blocks.clear();
  }
}

size_t KvCache::size_bytes() const {
  size_t rows = 0;
  for (const LayerBlocks& l : layers_) rows += length_ - l.first_kept;
  return 2 * rows * row_bytes();
}

int64_t KvCache::blocks_held() const {
  int64_t n = 0;
  for (const LayerBlocks& l : layers_) {
    for (const uint8_t* b : l.blocks) n += b != nullptr;
  }
  return n;
}

size_t KvCache::allocated_bytes() const {
  return blocks_held() * pool_->block_bytes();
}

WeightType KvCache::type() const {
  return precision_ == Precision::kF32 ? WeightType::kF32 : WeightType::kBf16;
}

int64_t KvCache::ClampDrop(const LayerBlocks& l, int64_t position) const {
  const int64_t reserved_end =
      static_cast<int64_t>(l.blocks.size()) * block_rows_;
  return std::min(std::max(position, l.first_kept),
                  std::max(reserved_end, length_));
}

int64_t KvCache::BlocksBelow(const LayerBlocks& l, int64_t position) const {
  const int64_t from = l.first_kept / block_rows_;
  const int64_t to =
      std::min<int64_t>(ClampDrop(l, position) / block_rows_, l.blocks.size());
  return std::max<int64_t>(0, to - from);
}

int64_t KvCache::BlocksToGrow(const LayerBlocks& l, int64_t first_kept,
                              int64_t length) const {
  const int64_t have =
      std::max<int64_t>(l.blocks.size(), first_kept / block_rows_);
  return std::max<int64_t>(0, CeilDiv(length, block_rows_) - have);
}

void KvCache::Drop(LayerBlocks& l, int64_t position,
                   std::vector<uint8_t*>* spare) {
  position = ClampDrop(l, position);
  const int64_t to = std::min<int64_t>(position / block_rows_, l.blocks.size());
  for (int64_t i = l.first_kept / block_rows_; i < to; ++i) {
    if (spare != nullptr) {
      spare->push_back(l.blocks[i]);
    } else {
      pool_->Release(l.blocks[i]);
    }
    l.blocks[i] = nullptr;
  }
  l.first_kept = position;
}

void KvCache::Grow(LayerBlocks& l, int64_t length,
                   std::vector<uint8_t*>* spare) {
  const int64_t need = CeilDiv(length, block_rows_);
  const int64_t from =
      std::max<int64_t>(l.blocks.size(), l.first_kept / block_rows_);
  if (need <= from) return;
  l.blocks.resize(need, nullptr);
  for (int64_t i = from; i < need; ++i) {
    if (spare != nullptr && !spare->empty()) {
      l.blocks[i] = spare->back();
      spare->pop_back();
    } else {
      l.blocks[i] = pool_->Take();
    }
  }
}

void KvCache::DropBelow(int64_t layer, int64_t position) {
  Drop(layers_[layer], position, nullptr);
  Tell(KvCacheOp::kDropBelow, layer, position);
}

void KvCache::DropBelow(int64_t position) {
  for (LayerBlocks& l : layers_) Drop(l, position, nullptr);
  Tell(KvCacheOp::kDropBelow, -1, position);
}

void KvCache::Truncate(int64_t length) {
  Tell(KvCacheOp::kTruncate, -1, length);
  length_ = std::min(length_, std::max<int64_t>(0, length));
  const int64_t keep_blocks = CeilDiv(length_, block_rows_);
  for (LayerBlocks& l : layers_) {
    if (l.first_kept > length_) {
      // Nothing below the new end is kept: start over from it.
      for (uint8_t* b : l.blocks) pool_->Release(b);
      l.blocks.clear();
      l.first_kept = length_;
    }
    for (size_t i = keep_blocks; i < l.blocks.size(); ++i)
      pool_->Release(l.blocks[i]);
    if (static_cast<int64_t>(l.blocks.size()) > keep_blocks)
      l.blocks.resize(keep_blocks);
  }
}

void KvCache::Reset(int64_t length) {
  Tell(KvCacheOp::kReset, -1, length);
  ReleaseAll();
  length_ = std::max<int64_t>(0, length);
  for (LayerBlocks& l : layers_) l.first_kept = length_;
}

absl::Status KvCache::Reserve(int64_t length) {
  int64_t n = 0;
  for (const LayerBlocks& l : layers_)
    n += BlocksToGrow(l, l.first_kept, length);
  if (absl::Status s = pool_->Reserve(n); !s.ok()) return s;
  for (LayerBlocks& l : layers_) Grow(l, length, nullptr);
  Tell(KvCacheOp::kReserve, -1, length);
  return absl::OkStatus();
}

absl::Status KvCache::ReserveLayer(int64_t layer, int64_t length) {
  LayerBlocks& l = layers_[layer];
  if (absl::Status s = pool_->Reserve(BlocksToGrow(l, l.first_kept, length));
      !s.ok()) {
    return s;
  }
  Grow(l, length, nullptr);
  Tell(KvCacheOp::kReserve, layer, length);
  return absl::OkStatus();
}

int64_t KvCache::BlocksToPrepare(absl::Span<const int64_t> keep,
                                 int64_t length) const {
  int64_t grow = 0, freed = 0;
  for (size_t i = 0; i < layers_.size(); ++i) {
    const LayerBlocks& l = layers_[i];
    freed += BlocksBelow(l, keep[i]);
    grow += BlocksToGrow(l, ClampDrop(l, keep[i]), length);
  }
  return std::max<int64_t>(0, grow - freed);
}

void KvCache::Prepare(absl::Span<const int64_t> keep, int64_t length) {
  // Blocks released below the kept range are reused above it before any is
  // taken from the pool's reservation; the rest go back to the pool.
  std::vector<uint8_t*> spare;
  for (size_t i = 0; i < layers_.size(); ++i) Drop(layers_[i], keep[i], &spare);
  for (LayerBlocks& l : layers_) Grow(l, length, &spare);
  for (uint8_t* b : spare) pool_->Release(b);
}

void KvCache::CheckHostAccess(const char* what) const {
  if (pool_->host_accessible()) return;
  std::fprintf(stderr,
               "kvd: %s: the cache's blocks are not host memory (a device "
               "pool); only its backend may touch them\n",
               what);
  std::abort();
}

uint8_t* KvCache::Row(const LayerBlocks& l, int64_t position,
                      bool value) const {
  CheckHostAccess("reading or writing K/V rows on the host");
  const int64_t r = position % block_rows_;
  return l.blocks[position / block_rows_] +
         (value ? block_rows_ + r : r) * row_bytes();
}

kernels::cpu::KvRows KvCache::Keys(int64_t layer) const {
  CheckHostAccess("KvCache::Keys/Values");
  kernels::cpu::KvRows rows{type(), nullptr, row_size_};
  rows.blocks = layers_[layer].blocks.data();
  rows.block_rows = block_rows_;
  return rows;
}

kernels::cpu::KvRows KvCache::Values(int64_t layer) const {
  CheckHostAccess("KvCache::Keys/Values");
  kernels::cpu::KvRows rows = Keys(layer);
  rows.offset_bytes = block_rows_ * row_bytes();
  return rows;
}

void KvCache::Write(uint8_t* dst, const float* row) {
  if (precision_ == Precision::kF32) {
    std::memcpy(dst, row, row_bytes());
  } else {
    kernels::cpu::FloatToBf16(row, reinterpret_cast<uint16_t*>(dst), row_size_);
  }
}

void KvCache::WriteKey(int64_t layer, int64_t position, const float* row) {
  Write(Row(layers_[layer], position, false), row);
}

void KvCache::WriteValue(int64_t layer, int64_t position, const float* row) {
  Write(Row(layers_[layer], position, true), row);
}

void KvCache::WriteRows(int64_t layer, int64_t position, int64_t n,
                        const uint8_t* keys, const uint8_t* values) {
  const LayerBlocks& l = layers_[layer];
  const size_t rb = row_bytes();
  for (int64_t i = 0; i < n;) {
    const int64_t p = position + i;
    const int64_t run = std::min(n - i, block_rows_ - p % block_rows_);
    std::memcpy(Row(l, p, false), keys + i * rb, run * rb);
    std::memcpy(Row(l, p, true), values + i * rb, run * rb);
    i += run;
  }
}

const uint8_t* KvCache::KeyBytes(int64_t layer, int64_t position) const {
  return Row(layers_[layer], position, false);
}

const uint8_t* KvCache::ValueBytes(int64_t layer, int64_t position) const {
  return Row(layers_[layer], position, true);
}

uint8_t* KvCache::MutableKeyBytes(int64_t layer, int64_t position) {
  return Row(layers_[layer], position, false);
}

uint8_t* KvCache::MutableValueBytes(int64_t layer, int64_t position) {
  return Row(layers_[layer], position, true);
}

}  // namespace kvd::ops
