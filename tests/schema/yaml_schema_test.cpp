// The schema walker the topology, GPU-profile and recipe loaders share: what it checks itself,
// and what it hands to a loader (a custom leaf, with its dotted key).
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "schema/errors.hpp"
#include "schema/yaml_schema.hpp"

namespace nodeemu::schema {
namespace {

Field small_schema() {
  return map("", {integer("count", "how many", ints(1, 8)),
                  optional(real("rate", "per second", kPositive)),
                  map("section", {optional(custom("anything")), optional(str("name", "a name"))})});
}

std::string error_of(const std::string& text, const CustomLeaf& leaf = {}) {
  try {
    const CustomLeaf ignore = [](const Field&, const YAML::Node&, const std::string&,
                                 const std::string&) {};
    validate(load_document(text, "f.yaml", "a map"), small_schema(), "f.yaml",
             leaf ? leaf : ignore);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(YamlSchema, TypesRangesAndRequiredKeys) {
  EXPECT_EQ(error_of("count: 3\nsection: {}\n"), "");
  EXPECT_EQ(error_of("count: 9\nsection: {}\n"),
            "f.yaml: count: line 1: must be in [1, 8] (how many), got '9'");
  EXPECT_EQ(error_of("count: '3'\nsection: {}\n"),
            "f.yaml: count: line 1: expected an integer (how many), got the string '3'; remove "
            "the quotes");
  EXPECT_EQ(error_of("count: 3\n"),
            "f.yaml: section: missing required key; add a map 'section:' with its keys");
  EXPECT_EQ(error_of("count:\nsection: {}\n"),
            "f.yaml: count: line 1: expected an integer (how many), got nothing");
  EXPECT_EQ(error_of("count: 3\nrate: -1\nsection: {}\n"),
            "f.yaml: rate: line 2: must be > 0 (per second), got '-1'");
}

TEST(YamlSchema, UnknownAndRepeatedKeys) {
  EXPECT_EQ(error_of("count: 3\nsection: {nmae: x}\n"),
            "f.yaml: section.nmae: line 2: unknown key; did you mean 'section.name'?");
  EXPECT_EQ(error_of("count: 3\ncount: 4\nsection: {}\n"),
            "f.yaml: count: line 2: given twice (also at line 1); keep one");
}

TEST(YamlSchema, CustomLeavesGoToTheLoaderWithTheirKey) {
  std::map<std::string, std::string> seen;
  EXPECT_EQ(error_of("count: 3\nsection: {anything: [1, two]}\n",
                     [&](const Field& f, const YAML::Node& n, const std::string& key,
                         const std::string& at) {
                       seen[key] = f.name + " " + std::to_string(n.size()) + " " + at;
                     }),
            "");
  EXPECT_EQ(seen,
            (std::map<std::string, std::string>{{"section.anything", "anything 2 line 2: "}}));
}

TEST(YamlSchema, SyntaxErrorsAndEmptyDocuments) {
  EXPECT_EQ(error_of("count: [3\n").rfind("f.yaml: yaml: line ", 0), 0u);
  EXPECT_EQ(error_of(""), "f.yaml: yaml: the document is empty; expected a map");
  EXPECT_TRUE(load_document("", "f.yaml", "a map", /*allow_empty=*/true).IsNull());
  EXPECT_EQ(
      dotted_keys(small_schema()),
      (std::vector<std::string>{"count", "rate", "section", "section.anything", "section.name"}));
}

}  // namespace
}  // namespace nodeemu::schema
