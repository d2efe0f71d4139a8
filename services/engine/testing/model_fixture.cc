#include "services/engine/testing/model_fixture.h"

#include <cstring>

#include "ops/tokenizer/gguf_tokenizer.h"

namespace kvd::engine::testing {

::testing::AssertionResult LogitsBitIdentical(
    const std::vector<std::vector<float>>& want,
    const std::vector<std::vector<float>>& got) {
  if (want.size() != got.size()) {
    return ::testing::AssertionFailure()
           << "logits of " << got.size() << " steps, want " << want.size();
  }
  for (size_t i = 0; i < want.size(); ++i) {
    if (want[i].size() != got[i].size()) {
      return ::testing::AssertionFailure()
             << "step " << i << " has " << got[i].size() << " logits, want "
             << want[i].size();
    }
    if (std::memcmp(want[i].data(), got[i].data(),
                    want[i].size() * sizeof(float)) != 0) {
      return ::testing::AssertionFailure() << "logits differ at step " << i;
    }
  }
  return ::testing::AssertionSuccess();
}

void TinyModelTest::LoadModel(ops::testing::TinyModelSpec spec) {
  spec.family = GetParam().family;
  absl::StatusOr<std::unique_ptr<ops::Model>> m =
      ops::testing::LoadTinyModel(spec, GetParam().precision);
  ASSERT_TRUE(m.ok()) << m.status();
  model_ = std::move(*m);
  absl::StatusOr<std::unique_ptr<ops::Tokenizer>> t =
      ops::TokenizerFromGguf(model_->file());
  ASSERT_TRUE(t.ok()) << t.status();
  tokenizer_ = std::move(*t);
}

}  // namespace kvd::engine::testing
