// Tiny random-weight models written as real GGUF files, for fast tests of the
// forward pass.
//
// The weights are a deterministic function of the seed; the files go through
// the same loader as real models. Test-only.
//
//   std::string path = WriteTinyModel(TinyModelSpec{.family = "gemma3"},
//   testing::TempDir());
#ifndef KVD_OPS_MODEL_TESTING_TINY_MODEL_H_
#define KVD_OPS_MODEL_TESTING_TINY_MODEL_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ops/model/model.h"

namespace kvd::ops::testing {

struct TinyModelSpec {
  std::string family = "llama";  // llama, qwen2 or gemma3
  int64_t n_layers = 3;
  int64_t d_model = 64;
  int64_t n_heads = 4;
  int64_t n_kv_heads = 2;
  int64_t head_dim = 16;
  int64_t d_ff = 96;
  int64_t vocab_size = 300;
  int64_t context_length = 4096;
  int64_t sliding_window = 8;  // gemma3 local layers
  bool tied_embeddings = true;
  uint32_t seed = 1;
  // Metadata values as a hostile or broken file would carry them (the
  // tensors still follow the fields above): block_count when nonzero, the
  // RMSNorm epsilon, and rope.freq_base when set (else the family's).
  uint32_t metadata_block_count = 0;
  float rms_eps = 1e-5f;
  std::optional<float> rope_freq_base;
};

// Writes the model to `dir`/tiny-<family>-<seed>.gguf and returns the path.
// A llama-family tiny model with 8 query and 8 K/V heads (d_ff 96): tensor
// parallel degrees 1, 2, 4 and 8 all divide it.
TinyModelSpec EightKvHeadSpec();

absl::StatusOr<std::string> WriteTinyModel(const TinyModelSpec& spec,
                                           const std::string& dir);

// Writes the model under ::testing::TempDir() and loads it through
// Model::Load in `precision` with `threads` worker threads.
absl::StatusOr<std::unique_ptr<Model>> LoadTinyModel(const TinyModelSpec& spec,
                                                     Precision precision,
                                                     int threads = 2);

// Runs `prompt`, then each of `steps` as a single-token step, in a fresh
// cache of `m`: every step's last-position logits, one vocab_size row after
// another. Fixed tokens, not sampled ones, so that runs in lockstep (shards)
// never diverge on a choice.
absl::StatusOr<std::vector<float>> LastLogitsPerStep(
    const ModelBackend& m, const std::vector<int32_t>& prompt,
    const std::vector<int32_t>& steps);

}  // namespace kvd::ops::testing

#endif  // KVD_OPS_MODEL_TESTING_TINY_MODEL_H_
