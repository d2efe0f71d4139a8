// A model's fingerprint: the identity a stored session checkpoint is tied to.
//
// Residual checkpoints are only meaningful for the exact weights, tokenizer
// and architecture config that produced them, so the fingerprint is a SHA-256
// over the bytes of the files the model was loaded from: a GGUF file carries
// all three; a Hugging Face directory contributes config.json, its tokenizer
// files and every *.safetensors file, in name order, each framed by its name
// and size. Content, not path or mtime: a copied or renamed file keeps its
// fingerprint, a re-quantized or edited one does not.
//
//   KVD_ASSIGN_OR_RETURN(std::string fp, FingerprintModelFiles(path));
//   // "sha256:3f9a..." (71 characters)
//
// Thread-safety: pure function (reads files).
#ifndef KVD_OPS_MODEL_FINGERPRINT_H_
#define KVD_OPS_MODEL_FINGERPRINT_H_

#include <string>

#include "absl/status/statusor.h"

namespace kvd::ops {

// `path`: a GGUF file or a Hugging Face checkpoint directory, as given to
// Model::Load / Model::LoadHuggingFace. NOT_FOUND / UNAVAILABLE naming the
// file when it cannot be read.
absl::StatusOr<std::string> FingerprintModelFiles(const std::string& path);

}  // namespace kvd::ops

#endif  // KVD_OPS_MODEL_FINGERPRINT_H_
