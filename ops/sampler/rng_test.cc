#include "ops/sampler/rng.h"

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace kvd::ops {
namespace {

// testdata/rng_vectors.json: xoshiro256** outputs from the randomgen package
// (testdata/make_rng_vectors.py), as decimal strings.
nlohmann::json LoadVectors() {
  std::ifstream in("ops/sampler/testdata/rng_vectors.json");
  EXPECT_TRUE(in.good());
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str());
}

uint64_t U64(const nlohmann::json& s) {
  return std::stoull(s.get<std::string>());
}

TEST(RngTest, SplitMix64MatchesItsPublishedFirstOutput) {
  uint64_t state = 0;
  EXPECT_EQ(SplitMix64(&state), 0xe220a8397b1dcdafull);
}

TEST(RngTest, MatchesReferenceImplementation) {
  const nlohmann::json vectors = LoadVectors();
  ASSERT_FALSE(vectors["cases"].empty());
  for (const nlohmann::json& c : vectors["cases"]) {
    SCOPED_TRACE("seed " + c["seed"].get<std::string>());
    Rng rng(U64(c["seed"]));
    for (int i = 0; i < 4; ++i)
      EXPECT_EQ(rng.state()[i], U64(c["state"][i])) << i;
    for (const nlohmann::json& want : c["outputs"])
      EXPECT_EQ(rng.Next(), U64(want));

    Rng again(U64(c["seed"]));
    for (const nlohmann::json& want : c["doubles"]) {
      const double u = again.NextDouble();
      EXPECT_EQ(u, want.get<double>());
      EXPECT_GE(u, 0.0);
      EXPECT_LT(u, 1.0);
    }
  }
}

TEST(RngTest, StateRoundTripsAndResumesTheStream) {
  Rng a(7);
  for (int i = 0; i < 10; ++i) a.Next();
  Rng b(12345);
  b.set_state(a.state());
  for (int i = 0; i < 100; ++i) EXPECT_EQ(a.Next(), b.Next());
}

}  // namespace
}  // namespace kvd::ops
