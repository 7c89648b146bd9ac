#include "common/flags.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace cleave {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

struct Fixture {
  std::string name = "default";
  int64_t count = 7;
  double ratio = 0.5;
  bool verbose = false;
  bool color = true;
  uint64_t budget = 1;
  FlagSet flags{"prog", "[flags] ARGS", "A test program."};
  Fixture() {
    flags.addString("name", &name, "a name");
    flags.addInt("count", &count, "a count");
    flags.addDouble("ratio", &ratio, "a ratio");
    flags.addBool("verbose", &verbose, "talk more");
    flags.addBool("color", &color, "use color");
    flags.addBytes("budget", &budget, "memory budget");
  }
  absl::StatusOr<std::vector<std::string>> parse(std::vector<std::string> args) {
    return flags.parse(args);
  }
};

TEST(FlagSetTest, ParsesEveryFormAndKeepsPositionalsInOrder) {
  Fixture f;
  auto positional = f.parse({"a", "--name=x", "--count", "42", "b", "--ratio=0.25", "--verbose",
                             "--no-color", "--budget=2GiB", "--", "--not-a-flag"});
  ASSERT_TRUE(positional.ok()) << positional.status();
  EXPECT_THAT(*positional, ElementsAre("a", "b", "--not-a-flag"));
  EXPECT_EQ(f.name, "x");
  EXPECT_EQ(f.count, 42);
  EXPECT_DOUBLE_EQ(f.ratio, 0.25);
  EXPECT_TRUE(f.verbose);
  EXPECT_FALSE(f.color);
  EXPECT_EQ(f.budget, 2ull << 30);
}

TEST(FlagSetTest, UnsetFlagsKeepDefaults) {
  Fixture f;
  ASSERT_TRUE(f.parse({}).ok());
  EXPECT_EQ(f.name, "default");
  EXPECT_EQ(f.count, 7);
  EXPECT_TRUE(f.color);
}

TEST(FlagSetTest, UnknownFlagNamesItAndSuggestsTheClosest) {
  Fixture f;
  auto result = f.parse({"--cuont=3"});
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(result.status().message(), HasSubstr("unknown flag --cuont"));
  EXPECT_THAT(result.status().message(), HasSubstr("did you mean --count?"));
}

TEST(FlagSetTest, MalformedValuesNameTheFlag) {
  for (std::vector<std::string> args :
       std::vector<std::vector<std::string>>{{"--count=abc"},
                                             {"--ratio=x"},
                                             {"--verbose=maybe"},
                                             {"--budget=3PB"},
                                             {"--count"},
                                             {"-c"},
                                             {"--log-level=loud"}}) {
    Fixture f;
    auto result = f.parse(args);
    ASSERT_FALSE(result.ok()) << args[0];
    EXPECT_THAT(result.status().message(), HasSubstr("-")) << args[0];
  }
  Fixture f;
  EXPECT_THAT(f.parse({"--count=abc"}).status().message(),
              HasSubstr("invalid value 'abc' for --count"));
  EXPECT_THAT(f.parse({"--count"}).status().message(), HasSubstr("--count needs a value"));
}

TEST(FlagSetTest, NegationOnlyAppliesToBooleans) {
  Fixture f;
  EXPECT_FALSE(f.parse({"--no-count"}).ok());
}

TEST(FlagSetTest, HelpAndVersionAreRecognized) {
  Fixture f;
  ASSERT_TRUE(f.parse({"--help"}).ok());
  EXPECT_TRUE(f.flags.helpRequested());
  std::string help = f.flags.helpText();
  EXPECT_THAT(help, HasSubstr("Usage: prog [flags] ARGS"));
  EXPECT_THAT(help, HasSubstr("--count"));
  EXPECT_THAT(help, HasSubstr("(default: 7)"));
  Fixture g;
  ASSERT_TRUE(g.parse({"--version"}).ok());
  EXPECT_TRUE(g.flags.versionRequested());
}

TEST(ParseBytesTest, AcceptsDecimalAndBinarySuffixes) {
  EXPECT_EQ(*parseBytes("123"), 123u);
  EXPECT_EQ(*parseBytes("4K"), 4000u);
  EXPECT_EQ(*parseBytes("1.5GiB"), 1536ull << 20);
  EXPECT_EQ(*parseBytes("2TB"), 2000000000000ull);
  EXPECT_FALSE(parseBytes("").ok());
  EXPECT_FALSE(parseBytes("GiB").ok());
  EXPECT_FALSE(parseBytes("10XB").ok());
  EXPECT_FALSE(parseBytes("99999999999TiB").ok());
}

TEST(FlagSetDeathTest, ErrorsExitWithStatusTwoAndOneLine) {
  Fixture f;
  std::vector<std::string> storage = {"prog", "--bogus"};
  std::vector<char*> argv = {storage[0].data(), storage[1].data()};
  EXPECT_EXIT(parseFlagsOrExit(f.flags, 2, argv.data()), testing::ExitedWithCode(2),
              "prog: error: unknown flag --bogus");
}

}  // namespace
}  // namespace cleave
