// Tiny random-weight Hugging Face checkpoints (config.json + safetensors) and
// the same weights as a GGUF file laid out the way llama.cpp's converter
// (convert_hf_to_gguf.py) writes them, for testing the HF loader against the
// GGUF path. Test-only.
//
// The converter's rearrangements reproduced here: tensor names map to GGUF
// names; llama's Q/K rows are permuted per head so that rows i and i + d/2
// become rows 2i and 2i + 1 (GGML's interleaved RoPE); gemma3 norm weights
// are stored as w + 1.
//
//   HfTinySpec spec{.family = "gemma3"};
//   std::vector<HfTensor> tensors = MakeHfTinyTensors(spec);
//   KVD_RETURN_IF_ERROR(WriteHfCheckpoint(spec, tensors, dir));
//   KVD_ASSIGN_OR_RETURN(std::string gguf,
//                        WriteGgufEquivalent(spec, tensors, dir + ".gguf"));
#ifndef KVD_OPS_MODEL_TESTING_HF_TINY_MODEL_H_
#define KVD_OPS_MODEL_TESTING_HF_TINY_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace kvd::ops::testing {

struct HfTinySpec {
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
  std::string matrix_dtype = "F32";  // F32, F16 or BF16
  std::string vector_dtype = "F32";  // of norms and biases
  // > 1: model-0000i-of-0000n.safetensors files and an index.
  int shards = 1;
  // gemma3 only: the Gemma3ForConditionalGeneration layout (text_config,
  // "language_model." tensor prefix, explicit layer_types, vision tensors).
  bool multimodal = false;
  uint32_t seed = 1;
};

struct HfTensor {
  std::string name;  // Hugging Face name
  std::vector<int64_t> shape;
  std::string dtype;          // F32, F16, BF16 (as stored), or I32
  std::vector<float> values;  // exactly representable in `dtype`
};

// Random weights under their Hugging Face names, in a fixed order.
std::vector<HfTensor> MakeHfTinyTensors(const HfTinySpec& spec);

// The config.json of `spec`.
std::string HfTinyConfigJson(const HfTinySpec& spec);

// A complete safetensors file holding `tensors`, in order.
std::string SafetensorsBytes(const std::vector<const HfTensor*>& tensors);

// Creates `dir` with config.json and the weights (sharded per spec.shards).
absl::Status WriteHfCheckpoint(const HfTinySpec& spec,
                               const std::vector<HfTensor>& tensors,
                               const std::string& dir);

// Writes the GGUF file a converter would make from the checkpoint to `path`.
absl::Status WriteGgufEquivalent(const HfTinySpec& spec,
                                 const std::vector<HfTensor>& tensors,
                                 const std::string& path);

}  // namespace kvd::ops::testing

#endif  // KVD_OPS_MODEL_TESTING_HF_TINY_MODEL_H_
