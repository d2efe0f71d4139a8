// Streamed deltas (generator.h): what a client assembles from the stream is
// what the generation returned at the end. For Generate alone and for many
// sequences batched by the Scheduler: the deltas' token ids concatenate to
// GenerateResult::tokens, their logprobs to GenerateResult::logprobs (bit
// for bit, and equal to ops::ComputeLogProbs of the logits the on_logits hook
// saw, the path the API used before deltas carried logprobs), their text to
// the result's text; text held back by a stop string still arrives with its
// tokens; a text-only callback keeps working.
#include "services/engine/generator.h"

#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "ops/model/testing/model_cases.h"
#include "ops/model/testing/tiny_model.h"
#include "services/engine/scheduler.h"
#include "services/engine/testing/model_fixture.h"

namespace kvd::engine {
namespace {

struct Stream {
  std::vector<GenerateDelta> deltas;
  std::vector<std::vector<float>> logits;  // from on_logits
};

bool SameLogProb(const ops::TokenLogProb& a, const ops::TokenLogProb& b) {
  return a.token == b.token &&
         std::memcmp(&a.logprob, &b.logprob, sizeof(float)) == 0;
}

void ExpectSameLogProbs(const std::vector<ops::LogProbs>& want,
                        const std::vector<ops::LogProbs>& got) {
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_TRUE(SameLogProb(want[i].chosen, got[i].chosen));
    ASSERT_EQ(want[i].top.size(), got[i].top.size());
    for (size_t k = 0; k < want[i].top.size(); ++k) {
      EXPECT_TRUE(SameLogProb(want[i].top[k], got[i].top[k]));
    }
  }
}

// Checks the stream against the result; returns the concatenated delta.
GenerateDelta CheckStream(const Stream& s, const GenerateResult& r,
                          const GenerateRequest& req) {
  GenerateDelta all;
  for (size_t i = 0; i < s.deltas.size(); ++i) {
    const GenerateDelta& d = s.deltas[i];
    EXPECT_FALSE(d.empty()) << "delta " << i << " carries nothing";
    EXPECT_EQ(d.logprobs.size(), req.logprobs ? d.tokens.size() : 0);
    all.Append(GenerateDelta(d));
  }
  EXPECT_EQ(all.tokens, r.tokens);
  EXPECT_EQ(all.text, r.text);
  EXPECT_EQ(r.logprobs.size(), req.logprobs ? r.tokens.size() : 0);
  ExpectSameLogProbs(r.logprobs, all.logprobs);
  if (req.logprobs) {
    // Independent of the sequence's bookkeeping: the logits it was given.
    EXPECT_EQ(s.logits.size(), r.tokens.size());
    std::vector<ops::LogProbs> from_logits;
    for (size_t i = 0; i < s.logits.size() && i < r.tokens.size(); ++i) {
      from_logits.push_back(ops::ComputeLogProbs(
          s.logits[i].data(), static_cast<int32_t>(s.logits[i].size()),
          r.tokens[i], req.top_logprobs));
    }
    ExpectSameLogProbs(from_logits, r.logprobs);
  }
  return all;
}

class GeneratorDeltaTest : public testing::TinyModelTest {
 protected:
  void SetUp() override { LoadModel(ops::testing::TinyModelSpec()); }

  GenerateRequest Request(int i) const {
    GenerateRequest r;
    r.prompt = ops::testing::RandomTokens(5 + (i * 37) % 90, 900 + i,
                                          model_->config().vocab_size);
    r.max_tokens = 12 + i % 7;
    r.ignore_eos = i % 3 != 0;
    r.logprobs = i % 4 != 3;
    r.top_logprobs = i % 5;
    r.sampling.temperature = i % 2 == 1 ? 0.8f : 0.0f;
    r.sampling.seed = 31 + i;
    return r;
  }

  static DeltaCallback Hook(GenerateRequest& r, Stream* s) {
    r.on_logits = [s](const float* l, int64_t n) {
      s->logits.emplace_back(l, l + n);
    };
    return [s](const GenerateDelta& d) { s->deltas.push_back(d); };
  }

  GenerateResult RunAlone(GenerateRequest r, Stream* s) {
    DeltaCallback cb = Hook(r, s);
    ops::KvCache cache = model_->NewCache();
    absl::StatusOr<GenerateResult> g =
        Generate(*model_, *tokenizer_, r, &cache, cb);
    EXPECT_TRUE(g.ok()) << g.status();
    return g.ok() ? *std::move(g) : GenerateResult();
  }
};

TEST_P(GeneratorDeltaTest, DeltasAddUpToTheResult) {
  for (int i = 0; i < 8; ++i) {
    SCOPED_TRACE(i);
    const GenerateRequest req = Request(i);
    Stream s;
    const GenerateResult r = RunAlone(req, &s);
    ASSERT_FALSE(r.tokens.empty());
    CheckStream(s, r, req);
  }
}

TEST_P(GeneratorDeltaTest, StopStringTokensArriveInTheLastDelta) {
  GenerateRequest req = Request(1);
  req.max_tokens = 24;
  Stream free_run;
  const GenerateResult full = RunAlone(req, &free_run);
  // A stop string from the middle of what the model writes anyway.
  ASSERT_GE(full.text.size(), 6u) << "the tiny model wrote too little text";
  size_t at = full.text.size() / 2;
  // Whole UTF-8 characters only (StopMatcher refuses anything else).
  while (at > 0 && (full.text[at] & 0xC0) == 0x80) --at;
  size_t end = at + 1;
  while (end < full.text.size() && (full.text[end] & 0xC0) == 0x80) ++end;
  req.stop = {full.text.substr(at, end - at)};
  const size_t first = full.text.find(req.stop[0]);
  Stream s;
  const GenerateResult r = RunAlone(req, &s);
  EXPECT_EQ(r.finish_reason, FinishReason::kStop);
  EXPECT_EQ(r.text, full.text.substr(0, first));
  const GenerateDelta all = CheckStream(s, r, req);
  // The tokens up to the stop string's are the free run's.
  ASSERT_LE(all.tokens.size(), full.tokens.size());
  EXPECT_TRUE(
      std::equal(all.tokens.begin(), all.tokens.end(), full.tokens.begin()));
}

TEST_P(GeneratorDeltaTest, TextOnlyCallbacksStillWork) {
  GenerateRequest req = Request(2);
  std::string text;
  ops::KvCache cache = model_->NewCache();
  absl::StatusOr<GenerateResult> g =
      Generate(*model_, *tokenizer_, req, &cache,
               [&text](std::string_view s) { text.append(s); });
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(text, g->text);
  // An empty std::function is no callback, not a bad_function_call.
  const std::function<void(std::string_view)> none;
  ops::KvCache cache2 = model_->NewCache();
  absl::StatusOr<GenerateResult> g2 =
      Generate(*model_, *tokenizer_, req, &cache2, none);
  ASSERT_TRUE(g2.ok()) << g2.status();
  EXPECT_EQ(g2->tokens, g->tokens);
}

// Batched with others, a sequence streams exactly what it streams alone.
TEST_P(GeneratorDeltaTest, BatchedStreamsMatchGenerateAlone) {
  constexpr int kSeqs = 8;
  std::vector<Stream> alone(kSeqs);
  std::vector<GenerateResult> want(kSeqs);
  for (int i = 0; i < kSeqs; ++i) want[i] = RunAlone(Request(i), &alone[i]);

  SchedulerOptions o;
  o.max_running = kSeqs;
  o.prefill_tokens_per_step = 40;
  Scheduler scheduler(*model_, o);
  std::vector<Stream> batched(kSeqs);
  std::vector<absl::StatusOr<GenerateResult>> got(kSeqs);
  std::vector<std::thread> threads;
  for (int i = 0; i < kSeqs; ++i) {
    threads.emplace_back([&, i] {
      GenerateRequest r = Request(i);
      DeltaCallback cb = Hook(r, &batched[i]);
      ops::KvCache cache = model_->NewCache();
      got[i] = scheduler.Run(*tokenizer_, r, &cache, cb);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kSeqs; ++i) {
    SCOPED_TRACE(i);
    ASSERT_TRUE(got[i].ok()) << got[i].status();
    const GenerateDelta a = CheckStream(batched[i], *got[i], Request(i));
    const GenerateDelta b = CheckStream(alone[i], want[i], Request(i));
    EXPECT_EQ(a.tokens, b.tokens);
    EXPECT_EQ(a.text, b.text);
    ExpectSameLogProbs(b.logprobs, a.logprobs);
  }
}

INSTANTIATE_TEST_SUITE_P(Families, GeneratorDeltaTest,
                         ::testing::ValuesIn(ops::testing::AllFamilyCases()),
                         ops::testing::FamilyCaseName);

}  // namespace
}  // namespace kvd::engine
