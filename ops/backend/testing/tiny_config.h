// A small llama-shaped ModelConfig for the CUDA backend's host-side tests
// (cache plans, block-id pools): GQA 4:2, head_dim 8, no weights. Test-only.
#ifndef KVD_OPS_BACKEND_TESTING_TINY_CONFIG_H_
#define KVD_OPS_BACKEND_TESTING_TINY_CONFIG_H_

#include <cstdint>

#include "ops/model/model_config.h"

namespace kvd::ops::testing {

inline ModelConfig TinyHostConfig(int64_t n_layers = 3) {
  ModelConfig c;
  c.n_layers = n_layers;
  c.d_model = 32;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 8;
  c.d_ff = 64;
  c.vocab_size = 100;
  c.context_length = 4096;
  c.rope_dim = 8;
  c.layers.resize(n_layers);
  return c;
}

}  // namespace kvd::ops::testing

#endif  // KVD_OPS_BACKEND_TESTING_TINY_CONFIG_H_
