// Model weights held in memory.
//
// A matrix's values are the exact fp32 dequantization of the file's tensor in
// the fp32 mode, and its round-to-nearest-even bf16 in the bf16 mode. By
// default (WeightStorage::kAsStored) a matrix stays as the file stores it
// (GGML blocks repacked with fp32 scales, bf16, fp16) when the GEMM can take
// that type (kernels/cpu/gemm.h): the GEMM dequantizes each weight into a
// register by the loader's own formulas, and in the bf16 mode rounds it to
// bf16 there, so the bits equal those of copies made at load
// (WeightStorage::kDequantized, kept for comparison) with 3-7x fewer bytes to
// hold and stream (in the bf16 mode where BlocksPayOff says so). Norm weights
// and biases are always fp32. Thread-safety: immutable after loading.
#ifndef KVD_OPS_MODEL_WEIGHTS_H_
#define KVD_OPS_MODEL_WEIGHTS_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/thread_pool.h"
#include "ops/gguf/gguf_file.h"
#include "ops/model/model_config.h"

namespace kvd::ops {

// How the file's matrices are held (same bits either way).
enum class WeightStorage {
  kAsStored,     // the file's blocks, dequantized inside the GEMM
  kDequantized,  // fp32 (fp32 mode) or bf16 (bf16 mode) copies made at load
};

// Whether WeightStorage::kAsStored keeps a quantized file's blocks in
// `precision` on this machine. Always in fp32. In bf16 only where AVX-512 with
// AVX512-BF16 runs the GEMM, which decodes blocks straight into vdpbf16ps's
// registers: elsewhere the bf16 mode's rounding and pair order cost too much
// per weight (AVX2 rounds per 8 weights, 31 vs ~60 tok/s measured on Zen 4
// forced to AVX2, and the pair emulation needs a permute per group), so the
// bf16 copies are made at load. Same bits either way.
bool BlocksPayOff(Precision precision);

// A rows x cols matrix (rows = output features) in fp32, bf16 or GGML blocks.
class Matrix {
 public:
  Matrix() = default;
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  bool empty() const { return rows_ == 0; }
  kernels::cpu::WeightView view() const;
  // Copies row r as fp32 (the embedding lookup).
  void RowToFloat(int64_t r, float* out) const;
  size_t size_bytes() const {
    return f32_.size() * 4 + bf16_.size() * 2 + blocks_.size();
  }

  // GGUF tensor `name`, which must have `cols` values per row and `rows` rows,
  // held per `precision` and `storage` (see the file comment).
  static absl::StatusOr<Matrix> FromGguf(const GgufFile& file,
                                         const std::string& name, int64_t rows,
                                         int64_t cols, Precision precision,
                                         kernels::cpu::ThreadPool* pool,
                                         WeightStorage storage);

  // Rows [r0, r1) and columns [c0, c1) of a block matrix, still as packed
  // blocks (a tensor-parallel shard's slice); nullopt unless this matrix holds
  // blocks and c0, c1 fall on block boundaries.
  std::optional<Matrix> SliceBlocks(int64_t r0, int64_t r1, int64_t c0,
                                    int64_t c1) const;

  // Builds a rows x cols matrix from fp32 rows: `row(r, dst)` writes row r's
  // `cols` values to dst, which are then stored as FromGguf stores dequantized
  // rows (copied in fp32 mode, rounded to nearest-even bf16 in bf16 mode). Rows
  // may be produced concurrently on `pool`; the first error is returned.
  static absl::StatusOr<Matrix> FromRows(
      int64_t rows, int64_t cols, Precision precision,
      kernels::cpu::ThreadPool* pool,
      const std::function<absl::Status(int64_t r, float* dst)>& row);

 private:
  kernels::cpu::WeightType type_ = kernels::cpu::WeightType::kF32;
  int64_t rows_ = 0;
  int64_t cols_ = 0;
  std::vector<float> f32_;
  std::vector<uint16_t> bf16_;
  std::vector<uint8_t> blocks_;  // kGgmlBlocks: rows packed by PackRow
  kernels::GgmlType block_type_ = kernels::GgmlType::kF32;
  // Held for the bf16 mode: blocks' weights round to bf16, and the products
  // are bf16 pairs (gemm.h).
  bool bf16_mode_ = false;
};

// A 1-D fp32 tensor (norm weights, biases) of exactly `n` values.
absl::StatusOr<std::vector<float>> VectorFromGguf(const GgufFile& file,
                                                  const std::string& name,
                                                  int64_t n);

struct LayerWeights {
  std::vector<float> attn_norm;
  Matrix wq, wk, wv, wo;
  std::vector<float> bq, bk, bv;      // qkv_bias
  std::vector<float> q_norm, k_norm;  // qk_norm
  std::vector<float> post_attn_norm;  // post_attn_norm
  std::vector<float> ffn_norm;
  Matrix w_gate, w_up, w_down;
  std::vector<float> post_ffn_norm;  // post_ffn_norm
};

struct ModelWeights {
  Matrix token_embedding;  // vocab x d_model
  std::vector<float> output_norm;
  Matrix output;  // empty when tied to token_embedding
  std::vector<LayerWeights> layers;

  const Matrix& output_matrix() const {
    return output.empty() ? token_embedding : output;
  }
  size_t size_bytes() const;
};

// Loads every tensor the config calls for; `progress(done, total)` is called as
// tensors load.
absl::StatusOr<ModelWeights> LoadWeights(
    const GgufFile& file, const ModelConfig& config, Precision precision,
    WeightStorage storage, kernels::cpu::ThreadPool* pool,
    const std::function<void(int, int)>& progress);

}  // namespace kvd::ops

#endif  // KVD_OPS_MODEL_WEIGHTS_H_
