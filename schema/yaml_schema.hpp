// Strict YAML files described by a schema: the topology, a GPU profile's YAML, a recipe. The
// format is described once, as data, so that the unknown/missing/duplicate/type/range checks are
// one walker instead of an if-chain per key, and so that the "did you mean" list is always the
// real set of keys. Every problem is a ConfigError naming the file and the dotted key.
#pragma once

#include <yaml-cpp/yaml.h>

#include <climits>
#include <functional>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace nodeemu::schema {

// kCustom: a leaf whose value the caller checks and converts (a recipe key's own types); the
// walker hands it over with its dotted key.
enum class Kind { kMap, kString, kInt, kReal, kBool, kIntList, kCustom };

// Allowed values of a number (for an int list: of each entry). Inclusive unless marked open.
struct Range {
  double lo = -std::numeric_limits<double>::infinity();
  double hi = std::numeric_limits<double>::infinity();
  bool lo_open = false;
  bool hi_open = false;

  bool contains(double v) const {
    return (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
  }
  std::string describe() const;
};

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr Range kPositive{0, kInf, true, false};
constexpr Range kNonNegative{0, kInf, false, false};
constexpr Range kFraction{0, 1, true, false};  // (0, 1]: an efficiency or a rate multiplier
constexpr Range ints(double lo, double hi = INT_MAX) {
  return Range{lo, hi, false, false};
}

struct Field {
  std::string name;
  Kind kind = Kind::kMap;
  // What the value means and its unit, quoted in error messages. For a map: where its keys are
  // listed, said instead of listing them when there are too many for one line.
  std::string help;
  Range range;
  bool required = true;
  std::vector<Field> children;  // kMap only
};

Field map(std::string name, std::vector<Field> children);
Field str(std::string name, std::string help);
Field integer(std::string name, std::string help, Range range);
Field real(std::string name, std::string help, Range range);
Field boolean(std::string name, std::string help);
Field int_list(std::string name, std::string help, Range entry_range);
Field custom(std::string name);
Field optional(Field f);

// Every dotted key under `f` (maps and leaves), for suggestions.
std::vector<std::string> dotted_keys(const Field& f);

// The single document of a YAML text. Throws ConfigError(file, "yaml", ...) for a syntax error
// (with line and column), an empty text (saying `expected`; unless `allow_empty`, which gives a
// null node) or several documents.
YAML::Node load_document(const std::string& text, const std::string& file,
                         const std::string& expected, bool allow_empty = false);
// Checks `doc` against `schema` (its root map) and throws on the first problem, in document order,
// so that a misspelt key is reported as unknown before its correct twin is reported as missing.
// A kCustom leaf is handed to `custom` with its dotted key and the line_of() its key (a null
// value has no line of its own); it throws what it finds wrong.
using CustomLeaf = std::function<void(const Field&, const YAML::Node&, const std::string& key,
                                      const std::string& at)>;
void validate(const YAML::Node& doc, const Field& schema, const std::string& file,
              const CustomLeaf& custom = {});

// "line N: ", leading a message the way the YAML syntax errors do.
std::string line_of(const YAML::Node& n);
// How a node appears in a message: its text when short, or what kind of thing it is.
std::string describe_node(const YAML::Node& n);
bool parse_int(std::string_view s, long long& out);
// Parses s * 10^exp10 by shifting the decimal exponent, so the result is the correctly rounded SI
// value of what was written.
bool parse_real(std::string_view s, double& out, int exp10 = 0);

// Reading a validated document by dotted key: every lookup is known to succeed.
class Reader {
 public:
  Reader(const YAML::Node& root, const std::string& file) : root_(root), file_(file) {}
  YAML::Node node(std::string_view path) const { return lookup(root_, path); }
  bool has(std::string_view path) const { return node(path).IsDefined(); }
  std::string str(std::string_view path) const { return node(path).Scalar(); }
  int integer(std::string_view path) const;
  bool boolean(std::string_view path) const { return node(path).Scalar() == "true"; }
  // The value in SI units: the written number times 10^exp10.
  double si(std::string_view path, int exp10) const;
  std::vector<int> int_list(std::string_view path) const;
  [[noreturn]] void fail(const std::string& key, const std::string& what) const;

 private:
  static YAML::Node lookup(const YAML::Node& n, std::string_view path);
  const YAML::Node& root_;
  const std::string& file_;
};

inline constexpr int kGiga = 9, kTera = 12, kMicro = -6, kMega = 6, kKilo = 3;

}  // namespace nodeemu::schema
