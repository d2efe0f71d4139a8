// Loading Hugging Face checkpoints into ops::Model.
//
// A checkpoint is a directory with config.json and the weights in one or more
// safetensors files: model.safetensors.index.json's "weight_map" names the
// shard of every tensor; without an index every *.safetensors file in the
// directory is read. Tensors may be F32, F16 or BF16; they are converted to
// the precision mode's dtype exactly as GGUF tensors are (weights.h).
//
// Families: llama (model_type "llama"), qwen2 ("qwen2") and the text model of
// gemma3 ("gemma3_text", or "gemma3" with a text_config; tensor prefixes
// "model.", "language_model.model." and "model.language_model." are all
// understood, the vision tower is ignored). The result is the same Model a
// converted GGUF gives, up to how the GGUF converters rearrange the weights:
//  - llama: converters permute the Q/K rows of each head so GGML's
//    interleaved RoPE applies; HF checkpoints are unpermuted and rotate
//    half-split pairs, so an HF llama runs with RopeStyle::kHalfSplit on the
//    weights as stored.
//  - gemma3: HF norms compute x * (1 + w) and converters store w + 1; the
//    loader adds 1 (in fp32) to every gemma3 norm weight.
//
// A checkpoint feature kvd would otherwise silently drop (a tensor of the text
// model the family does not use, such as an o_proj bias; RoPE scaling; logit
// soft-capping; another activation) is refused with UNIMPLEMENTED. Errors name
// the file and the tensor or key: NOT_FOUND for a missing config.json, shard
// or tensor; INVALID_ARGUMENT for a wrong shape, an unsupported dtype, or a
// malformed file.
//
// Thread-safety: the functions are reentrant; an HfCheckpoint is immutable
// after Open.
//
//   KVD_ASSIGN_OR_RETURN(std::unique_ptr<Model> model,
//                        Model::Load("/models/SmolLM2-135M-Instruct", opts));
//   // or, step by step:
//   KVD_ASSIGN_OR_RETURN(HfCheckpoint ckpt, HfCheckpoint::Open(dir));
//   KVD_ASSIGN_OR_RETURN(HfConfig hf, LoadHfConfig(dir + "/config.json"));
//   KVD_ASSIGN_OR_RETURN(ModelConfig config, ModelConfigFromHf(hf, dir));
#ifndef KVD_OPS_MODEL_HF_LOADER_H_
#define KVD_OPS_MODEL_HF_LOADER_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cpu/thread_pool.h"
#include "ops/model/model_config.h"
#include "ops/model/weights.h"
#include "ops/safetensors/hf_config.h"
#include "ops/safetensors/safetensors_file.h"

namespace kvd::ops {

// The safetensors files of one checkpoint directory, memory-mapped, with
// lookup by tensor name across all of them.
class HfCheckpoint {
 public:
  struct Entry {
    const SafetensorsFile* file = nullptr;
    const SafetensorsFile::Tensor* tensor = nullptr;
  };

  // Opens `dir`/model.safetensors.index.json and the shards it names (each
  // listed tensor must be in its shard), or else every *.safetensors file in
  // `dir`. A tensor name found in two files is INVALID_ARGUMENT.
  static absl::StatusOr<HfCheckpoint> Open(const std::string& dir);

  // The tensor called `name` and its file, or nullptr.
  const Entry* Find(const std::string& name) const;
  // Every tensor name, sorted.
  std::vector<std::string> TensorNames() const;
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, Entry> tensors_;
};

// Maps a parsed config.json to kvd's ModelConfig (architecture is the kvd
// family: "llama", "qwen2" or "gemma3"; name is `name`). `source` names the
// config file in errors. UNIMPLEMENTED for another model_type or a setting
// kvd's forward pass does not have.
absl::StatusOr<ModelConfig> ModelConfigFromHf(const HfConfig& hf,
                                              const std::string& name,
                                              const std::string& source);

// Loads every tensor `config` calls for from `ckpt`; the output matrix is
// tied to the embeddings when `tied` (config.json's tie_word_embeddings).
// `progress(done, total)` is called as layers load.
absl::StatusOr<ModelWeights> LoadHfWeights(
    const HfCheckpoint& ckpt, const ModelConfig& config, bool tied,
    Precision precision, kernels::cpu::ThreadPool* pool,
    const std::function<void(int, int)>& progress);

}  // namespace kvd::ops

#endif  // KVD_OPS_MODEL_HF_LOADER_H_
