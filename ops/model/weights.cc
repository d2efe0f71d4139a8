#include "ops/model/weights.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/packed_blocks.h"
#include "kernels/quant/dequant.h"
#include "kernels/quant/ggml_type.h"

namespace kvd::ops {
namespace {

using kernels::cpu::WeightType;

std::string DimsString(const GgufTensor& t) {
  std::string s = "[";
  for (size_t i = 0; i < t.dims.size(); ++i)
    absl::StrAppend(&s, i ? ", " : "", t.dims[i]);
  return s + "]";
}

absl::StatusOr<const GgufTensor*> CheckedTensor(const GgufFile& file,
                                                const std::string& name,
                                                int64_t rows, int64_t cols) {
  KVD_ASSIGN_OR_RETURN(const GgufTensor* t, file.GetTensor(name));
  if (t->dims.empty() || t->row_length() != cols || t->num_rows() != rows) {
    return absl::InvalidArgumentError(
        absl::StrCat(file.path(), ": tensor '", name, "' has dims ",
                     DimsString(*t), ", expected ", rows, " rows of ", cols,
                     " (inconsistent with the model's hyper-parameters)"));
  }
  if (!kernels::IsDequantizeSupported(t->type)) {
    return absl::InvalidArgumentError(
        absl::StrCat(file.path(), ": tensor '", name, "' has type ",
                     std::string(kernels::GgmlTypeName(t->type)),
                     ", which kvd cannot dequantize yet"));
  }
  return t;
}

}  // namespace

kernels::cpu::WeightView Matrix::view() const {
  const void* data =
      type_ == WeightType::kF32    ? static_cast<const void*>(f32_.data())
      : type_ == WeightType::kBf16 ? static_cast<const void*>(bf16_.data())
                                   : blocks_.data();
  return kernels::cpu::WeightView{type_, data,        rows_,      cols_,
                                  cols_, block_type_, bf16_mode_, bf16_mode_};
}

void Matrix::RowToFloat(int64_t r, float* out) const {
  switch (type_) {
    case WeightType::kF32:
      std::memcpy(out, f32_.data() + r * cols_, cols_ * sizeof(float));
      return;
    case WeightType::kBf16:
      kernels::cpu::Bf16ToFloat(bf16_.data() + r * cols_, out, cols_);
      return;
    case WeightType::kGgmlBlocks:
      break;
  }
  kernels::cpu::UnpackRow(block_type_,
                          blocks_.data() + r * view().row_stride_bytes(), cols_,
                          out, bf16_mode_);
}

bool BlocksPayOff(Precision precision) {
  return precision == Precision::kF32 ||
         (kernels::cpu::ActiveIsa() == kernels::cpu::Isa::kAvx512 &&
          kernels::cpu::HasAvx512Bf16());
}

std::optional<Matrix> Matrix::SliceBlocks(int64_t r0, int64_t r1, int64_t c0,
                                          int64_t c1) const {
  if (type_ != WeightType::kGgmlBlocks) return std::nullopt;
  const int64_t per = kernels::cpu::PackedBlockSize(block_type_);
  if (c0 % per != 0 || c1 % per != 0) return std::nullopt;
  const kernels::cpu::WeightView v = view();
  const int64_t stride = v.row_stride_bytes();
  const int64_t skip = v.bytes_for(c0), take = v.bytes_for(c1 - c0);
  Matrix m;
  m.type_ = WeightType::kGgmlBlocks;
  m.block_type_ = block_type_;
  m.bf16_mode_ = bf16_mode_;
  m.rows_ = r1 - r0;
  m.cols_ = c1 - c0;
  m.blocks_.resize(m.rows_ * take);
  for (int64_t r = 0; r < m.rows_; ++r) {
    std::memcpy(m.blocks_.data() + r * take,
                blocks_.data() + (r0 + r) * stride + skip, take);
  }
  return m;
}

absl::StatusOr<Matrix> Matrix::FromRows(
    int64_t rows, int64_t cols, Precision precision,
    kernels::cpu::ThreadPool* pool,
    const std::function<absl::Status(int64_t r, float* dst)>& row) {
  Matrix m;
  m.rows_ = rows;
  m.cols_ = cols;
  m.type_ = precision == Precision::kF32 ? WeightType::kF32 : WeightType::kBf16;
  m.bf16_mode_ = precision == Precision::kBf16;
  if (m.type_ == WeightType::kF32) {
    m.f32_.resize(rows * cols);
  } else {
    m.bf16_.resize(rows * cols);
  }
  std::vector<absl::Status> errors(pool != nullptr ? pool->num_threads() : 1);
  std::atomic<int> slot{0};
  auto work = [&](int64_t begin, int64_t end) {
    const int my_slot = slot.fetch_add(1);
    std::vector<float> tmp(m.type_ == WeightType::kBf16 ? cols : 0);
    for (int64_t r = begin; r < end; ++r) {
      float* dst =
          m.type_ == WeightType::kF32 ? m.f32_.data() + r * cols : tmp.data();
      absl::Status s = row(r, dst);
      if (!s.ok()) {
        errors[my_slot] = std::move(s);
        return;
      }
      if (m.type_ == WeightType::kBf16) {
        kernels::cpu::FloatToBf16(tmp.data(), m.bf16_.data() + r * cols, cols);
      }
    }
  };
  if (pool != nullptr) {
    pool->ParallelFor(rows, work);
  } else {
    work(0, rows);
  }
  for (const absl::Status& s : errors) KVD_RETURN_IF_ERROR(s);
  return m;
}

namespace {

// Drops the tensor's file pages once they are copied out, so loading never
// holds the file and the copies in full at once.
absl::StatusOr<Matrix> Released(const GgufFile& file, const GgufTensor& t,
                                absl::StatusOr<Matrix> m) {
  if (m.ok()) file.ReleaseResidentPages(t.data, t.size_bytes);
  return m;
}

}  // namespace

absl::StatusOr<Matrix> Matrix::FromGguf(const GgufFile& file,
                                        const std::string& name, int64_t rows,
                                        int64_t cols, Precision precision,
                                        kernels::cpu::ThreadPool* pool,
                                        WeightStorage storage) {
  KVD_ASSIGN_OR_RETURN(const GgufTensor* t,
                       CheckedTensor(file, name, rows, cols));
  const uint64_t row_bytes = t->row_bytes();
  const bool blocks = kernels::cpu::IsGemmBlockType(t->type) &&
                      cols % kernels::cpu::PackedBlockSize(t->type) == 0 &&
                      BlocksPayOff(precision);
  if (storage == WeightStorage::kAsStored &&
      (blocks || t->type == kernels::GgmlType::kBF16)) {
    // Kept as the file stores it; the GEMM's weights are the fp32
    // dequantization's values (bf16 widens exactly), rounded to bf16 in the
    // bf16 mode.
    Matrix m;
    m.rows_ = rows;
    m.cols_ = cols;
    m.bf16_mode_ = precision == Precision::kBf16;
    if (blocks) {
      m.type_ = WeightType::kGgmlBlocks;
      m.block_type_ = t->type;
      const int64_t packed = kernels::cpu::PackedRowBytes(t->type, cols);
      m.blocks_.resize(rows * packed);
      std::vector<absl::Status> errors(rows);
      auto pack = [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          errors[r] =
              kernels::cpu::PackRow(t->type, t->data + r * row_bytes, row_bytes,
                                    cols, m.blocks_.data() + r * packed);
        }
      };
      if (pool != nullptr) {
        pool->ParallelFor(rows, pack);
      } else {
        pack(0, rows);
      }
      for (const absl::Status& s : errors) {
        if (!s.ok()) {
          return absl::InvalidArgumentError(absl::StrCat(
              file.path(), ": tensor '", name, "': ", s.message()));
        }
      }
    } else {
      m.type_ = WeightType::kBf16;
      m.bf16_.resize(rows * cols);
      std::memcpy(m.bf16_.data(), t->data, rows * row_bytes);
    }
    return Released(file, *t, std::move(m));
  }
  return Released(
      file, *t,
      FromRows(rows, cols, precision, pool,
               [&](int64_t r, float* dst) -> absl::Status {
                 absl::Status s = kernels::DequantizeRow(
                     t->type, t->data + r * row_bytes, row_bytes, dst, cols);
                 if (!s.ok()) {
                   return absl::InvalidArgumentError(
                       absl::StrCat(file.path(), ": tensor '", name, "' row ",
                                    r, ": ", s.message()));
                 }
                 return absl::OkStatus();
               }));
}

absl::StatusOr<std::vector<float>> VectorFromGguf(const GgufFile& file,
                                                  const std::string& name,
                                                  int64_t n) {
  KVD_ASSIGN_OR_RETURN(const GgufTensor* t, CheckedTensor(file, name, 1, n));
  std::vector<float> v(n);
  KVD_RETURN_IF_ERROR(
      kernels::DequantizeRow(t->type, t->data, t->size_bytes, v.data(), n));
  return v;
}

size_t ModelWeights::size_bytes() const {
  size_t total = token_embedding.size_bytes() + output.size_bytes() +
                 output_norm.size() * 4;
  for (const LayerWeights& l : layers) {
    for (const Matrix* m :
         {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down})
      total += m->size_bytes();
  }
  return total;
}

absl::StatusOr<ModelWeights> LoadWeights(
    const GgufFile& file, const ModelConfig& c, Precision precision,
    WeightStorage storage, kernels::cpu::ThreadPool* pool,
    const std::function<void(int, int)>& progress) {
  ModelWeights w;
  const int total = static_cast<int>(c.n_layers) + 2;
  int done = 0;
  auto step = [&] {
    if (progress) progress(++done, total);
  };
  KVD_ASSIGN_OR_RETURN(w.token_embedding,
                       Matrix::FromGguf(file, "token_embd.weight", c.vocab_size,
                                        c.d_model, precision, pool, storage));
  KVD_ASSIGN_OR_RETURN(w.output_norm,
                       VectorFromGguf(file, "output_norm.weight", c.d_model));
  if (file.FindTensor("output.weight") != nullptr) {
    KVD_ASSIGN_OR_RETURN(w.output,
                         Matrix::FromGguf(file, "output.weight", c.vocab_size,
                                          c.d_model, precision, pool, storage));
  }
  step();
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = absl::StrCat("blk.", l, ".");
    LayerWeights lw;
    KVD_ASSIGN_OR_RETURN(
        lw.attn_norm, VectorFromGguf(file, p + "attn_norm.weight", c.d_model));
    KVD_ASSIGN_OR_RETURN(
        lw.wq, Matrix::FromGguf(file, p + "attn_q.weight", c.q_dim(), c.d_model,
                                precision, pool, storage));
    KVD_ASSIGN_OR_RETURN(lw.wk,
                         Matrix::FromGguf(file, p + "attn_k.weight", c.kv_dim(),
                                          c.d_model, precision, pool, storage));
    KVD_ASSIGN_OR_RETURN(lw.wv,
                         Matrix::FromGguf(file, p + "attn_v.weight", c.kv_dim(),
                                          c.d_model, precision, pool, storage));
    KVD_ASSIGN_OR_RETURN(
        lw.wo, Matrix::FromGguf(file, p + "attn_output.weight", c.d_model,
                                c.q_dim(), precision, pool, storage));
    if (c.qkv_bias) {
      KVD_ASSIGN_OR_RETURN(lw.bq,
                           VectorFromGguf(file, p + "attn_q.bias", c.q_dim()));
      KVD_ASSIGN_OR_RETURN(lw.bk,
                           VectorFromGguf(file, p + "attn_k.bias", c.kv_dim()));
      KVD_ASSIGN_OR_RETURN(lw.bv,
                           VectorFromGguf(file, p + "attn_v.bias", c.kv_dim()));
    }
    if (c.qk_norm) {
      KVD_ASSIGN_OR_RETURN(
          lw.q_norm,
          VectorFromGguf(file, p + "attn_q_norm.weight", c.head_dim));
      KVD_ASSIGN_OR_RETURN(
          lw.k_norm,
          VectorFromGguf(file, p + "attn_k_norm.weight", c.head_dim));
    }
    if (c.post_attn_norm) {
      KVD_ASSIGN_OR_RETURN(
          lw.post_attn_norm,
          VectorFromGguf(file, p + "post_attention_norm.weight", c.d_model));
    }
    KVD_ASSIGN_OR_RETURN(
        lw.ffn_norm, VectorFromGguf(file, p + "ffn_norm.weight", c.d_model));
    KVD_ASSIGN_OR_RETURN(lw.w_gate,
                         Matrix::FromGguf(file, p + "ffn_gate.weight", c.d_ff,
                                          c.d_model, precision, pool, storage));
    KVD_ASSIGN_OR_RETURN(
        lw.w_up, Matrix::FromGguf(file, p + "ffn_up.weight", c.d_ff, c.d_model,
                                  precision, pool, storage));
    KVD_ASSIGN_OR_RETURN(
        lw.w_down, Matrix::FromGguf(file, p + "ffn_down.weight", c.d_model,
                                    c.d_ff, precision, pool, storage));
    if (c.post_ffn_norm) {
      KVD_ASSIGN_OR_RETURN(
          lw.post_ffn_norm,
          VectorFromGguf(file, p + "post_ffw_norm.weight", c.d_model));
    }
    w.layers.push_back(std::move(lw));
    step();
  }
  step();
  return w;
}

}  // namespace kvd::ops
