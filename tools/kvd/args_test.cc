#include "tools/kvd/args.h"

#include "gtest/gtest.h"

namespace kvd::cli {
namespace {

Args MakeArgs() {
  Args a("demo", "A demo command.");
  a.Positional("TEXT", "some text");
  a.Flag("count", "3", "how many");
  a.Flag("stop", "", "stop string");
  a.Switch("quiet", "less output");
  return a;
}

TEST(Args, ParsesValuesSwitchesAndPositionals) {
  Args a = MakeArgs();
  ASSERT_TRUE(
      a.Parse({"--count", "7", "hello", "--stop=x", "--stop", "y", "--quiet"})
          .ok());
  EXPECT_EQ(*a.GetInt("count"), 7);
  EXPECT_EQ(a.GetAll("stop"), (std::vector<std::string>{"x", "y"}));
  EXPECT_TRUE(a.Has("quiet"));
  EXPECT_EQ(a.positional(), std::vector<std::string>{"hello"});
}

TEST(Args, DefaultsAndHelp) {
  Args a = MakeArgs();
  ASSERT_TRUE(a.Parse({"--help"}).ok());
  EXPECT_TRUE(a.help_requested());
  EXPECT_EQ(*a.GetInt("count"), 3);
  EXPECT_FALSE(a.Has("count"));
  EXPECT_NE(a.Help().find("--count VALUE  (default: 3)"), std::string::npos);
}

TEST(Args, GetIntInChecksTheRangeInclusively) {
  Args a = MakeArgs();
  ASSERT_TRUE(a.Parse({"--count", "7"}).ok());
  EXPECT_EQ(*a.GetIntIn("count", 7, 7), 7);
  const absl::Status low = a.GetIntIn("count", 8, 10).status();
  EXPECT_EQ(low.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(low.message().find("--count must be between 8 and 10, got 7"),
            std::string::npos)
      << low;
  EXPECT_FALSE(a.GetIntIn("count", 0, 6).ok());
  Args b = MakeArgs();
  ASSERT_TRUE(b.Parse({"--count", "x"}).ok());
  EXPECT_NE(b.GetIntIn("count", 0, 10).status().message().find("integer"),
            std::string::npos);
}

TEST(Args, ClearErrors) {
  Args a = MakeArgs();
  EXPECT_NE(a.Parse({"--nope"}).message().find("unknown flag --nope"),
            std::string::npos);
  Args b = MakeArgs();
  EXPECT_NE(b.Parse({"--count"}).message().find("needs a value"),
            std::string::npos);
  Args c = MakeArgs();
  ASSERT_TRUE(c.Parse({"--count", "x"}).ok());
  EXPECT_FALSE(c.GetInt("count").ok());
  Args d = MakeArgs();
  EXPECT_FALSE(d.Parse({"one", "two"}).ok());
  Args e = MakeArgs();
  EXPECT_FALSE(e.Parse({"--quiet=1"}).ok());
}

TEST(Args, VariadicLastPositional) {
  Args a("kvd test", "test");
  a.Positional("MESSAGE...", "messages");
  ASSERT_TRUE(a.Parse({"one", "two", "three"}).ok());
  EXPECT_EQ(a.positional().size(), 3u);
}

}  // namespace
}  // namespace kvd::cli
