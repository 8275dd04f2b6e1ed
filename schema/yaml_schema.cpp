#include "schema/yaml_schema.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <map>
#include <system_error>
#include <utility>

#include "schema/errors.hpp"
#include "schema/nearest_key.hpp"

namespace nodeemu::schema {

std::string format_number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

std::string Range::describe() const {
  if (hi == kInf) return std::string(lo_open ? "> " : ">= ") + format_number(lo);
  // Integer ranges capped only by int's size read better as ">= 1" than "in [1, 2147483647]".
  if (hi == INT_MAX) return ">= " + format_number(lo);
  return std::string("in ") + (lo_open ? "(" : "[") + format_number(lo) + ", " + format_number(hi) +
         (hi_open ? ")" : "]");
}

Field map(std::string name, std::vector<Field> children) {
  return Field{std::move(name), Kind::kMap, "", {}, true, std::move(children)};
}
Field str(std::string name, std::string help) {
  return Field{std::move(name), Kind::kString, std::move(help), {}, true, {}};
}
Field integer(std::string name, std::string help, Range range) {
  return Field{std::move(name), Kind::kInt, std::move(help), range, true, {}};
}
Field real(std::string name, std::string help, Range range) {
  return Field{std::move(name), Kind::kReal, std::move(help), range, true, {}};
}
Field int_list(std::string name, std::string help, Range entry_range) {
  return Field{std::move(name), Kind::kIntList, std::move(help), entry_range, true, {}};
}
Field boolean(std::string name, std::string help) {
  return Field{std::move(name), Kind::kBool, std::move(help), {}, true, {}};
}
Field custom(std::string name) {
  return Field{std::move(name), Kind::kCustom, "", {}, true, {}};
}
Field optional(Field f) {
  f.required = false;
  return f;
}

namespace {

// Past this many keys a map's valid keys are not listed in an error (its help says where they are).
constexpr std::size_t kMaxListedKeys = 16;

std::string join(const std::string& parent, const std::string& name) {
  return parent.empty() ? name : parent + "." + name;
}

std::string_view number_text(std::string_view s) {
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  return s;
}

const char* expected_type(Kind k) {
  switch (k) {
    case Kind::kMap:
      return "a map of keys";
    case Kind::kString:
      return "a string";
    case Kind::kInt:
      return "an integer";
    case Kind::kReal:
      return "a number";
    case Kind::kBool:
      return "true or false";
    case Kind::kIntList:
      return "a list of integers";
    case Kind::kCustom:
      return "a value";
  }
  return "";
}

// After "got the string '8'": when the text would have parsed, the quotes are the only problem.
std::string unquote_hint(const YAML::Node& n, bool parses_unquoted) {
  return n.Tag() == "!" && parses_unquoted ? "; remove the quotes" : "";
}

// ---------------------------------------------------------------------------------------------
// The walker: checks a document against the schema and throws on the first problem, in document
// order, so that a misspelt key is reported as unknown before its correct twin is reported as
// missing.

class Validator {
 public:
  Validator(const std::string& file, const Field& root, const CustomLeaf& custom)
      : file_(file), custom_(custom), keys_(dotted_keys(root)) {}

  void check(const YAML::Node& node, const Field& field, const std::string& path) const {
    if (field.kind == Kind::kMap) return check_map(node, field, path);
    if (field.kind == Kind::kCustom) return custom_(field, node, path, line_of(node));
    const std::string help = field.help.empty() ? "" : " (" + field.help + ")";
    if (field.kind == Kind::kIntList) return check_int_list(node, field, path, help);
    if (!node.IsScalar()) {
      fail(path, line_of(node) + "expected " + expected_type(field.kind) + help + ", got " +
                     describe_node(node));
    }
    const std::string& text = node.Scalar();
    // A quoted scalar was written as a string on purpose; do not second-guess it as a number.
    const bool quoted = node.Tag() == "!";
    double v = 0;
    switch (field.kind) {
      case Kind::kString:
        if (text.empty()) fail(path, line_of(node) + "must not be empty" + help);
        return;
      case Kind::kBool:
        if (quoted || (text != "true" && text != "false"))
          fail(path,
               line_of(node) + "expected true or false" + help + ", got " + describe_node(node));
        return;
      case Kind::kInt: {
        long long i = 0;
        bool parses = parse_int(text, i);
        if (quoted || !parses) {
          fail(path, line_of(node) + "expected an integer" + help + ", got " + describe_node(node) +
                         unquote_hint(node, parses));
        }
        v = static_cast<double>(i);
        break;
      }
      case Kind::kReal: {
        bool parses = parse_real(text, v);
        if (quoted || !parses) {
          fail(path, line_of(node) + "expected a number" + help + ", got " + describe_node(node) +
                         unquote_hint(node, parses));
        }
        break;
      }
      case Kind::kMap:
      case Kind::kIntList:
      case Kind::kCustom:
        return;  // handled above
    }
    if (!field.range.contains(v)) {
      fail(path, line_of(node) + "must be " + field.range.describe() + help + ", got " +
                     describe_node(node));
    }
  }

 private:
  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw ConfigError(file_, key, what);
  }

  void check_map(const YAML::Node& node, const Field& field, const std::string& path) const {
    // The root has no key of its own; a document that is not a map is a YAML-level problem.
    const std::string self = path.empty() ? "yaml" : path;
    if (!node.IsMap()) {
      fail(self, line_of(node) + "expected a map of keys, got " + describe_node(node));
    }
    // yaml-cpp keeps both copies of a repeated key and reads the first; a silent pick between
    // two figures is exactly what strict loading is for.
    std::map<std::string, YAML::Mark> seen;
    for (const auto& kv : node) {
      if (!kv.first.IsScalar()) {
        fail(self, line_of(kv.first) + "keys must be plain names, got " + describe_node(kv.first));
      }
      const std::string& name = kv.first.Scalar();
      const std::string key = join(path, name);
      auto [it, inserted] = seen.emplace(name, kv.first.Mark());
      if (!inserted) {
        fail(key, line_of(kv.first) + "given twice (also at line " +
                      std::to_string(it->second.line + 1) + "); keep one");
      }
      auto child = std::find_if(field.children.begin(), field.children.end(),
                                [&](const Field& c) { return c.name == name; });
      if (child == field.children.end()) {
        fail(key, line_of(kv.first) + unknown_key_message(field, path, name));
      }
      // A null value is marked where the next token starts; its key's line is the one to name.
      if (child->kind == Kind::kCustom) {
        custom_(*child, kv.second, key, line_of(kv.first));
      } else if (kv.second.IsNull()) {
        fail(
            key,
            line_of(kv.first) + "expected " + expected_type(child->kind) +
                (child->help.empty() || child->kind == Kind::kMap ? "" : " (" + child->help + ")") +
                ", got nothing");
      } else {
        check(kv.second, *child, key);
      }
    }
    for (const Field& c : field.children) {
      if (!c.required || seen.count(c.name)) continue;
      std::string what = "missing required key; add ";
      if (c.kind == Kind::kMap) {
        what += "a map '" + c.name + ":' with its keys";
      } else {
        what += std::string(expected_type(c.kind)) + (c.help.empty() ? "" : " (" + c.help + ")");
      }
      if (!path.empty()) {
        what += " to '" + path + "'";
        if (!node.Mark().is_null()) what += " (line " + std::to_string(node.Mark().line + 1) + ")";
      }
      fail(join(path, c.name), what);
    }
  }

  std::string unknown_key_message(const Field& field, const std::string& path,
                                  const std::string& name) const {
    std::string what = "unknown key";
    const Suggestion s = nearest_key(keys_, path, name);
    if (!s.key.empty()) {
      what += "; did you mean '" + s.key + "'?";
      if (!s.elsewhere) return what;
      // A key that exists only in another map may be a key that this map simply lacks, so the
      // suggestion alone could mislead; say what does belong here too.
      what += " Otherwise";
    }
    const std::string where = path.empty() ? std::string("at the top level") : "in '" + path + "'";
    if (field.children.size() > kMaxListedKeys && !field.help.empty())
      return what + (s.key.empty() ? "; " : " ") + "the keys " + where + " are listed by " +
             field.help;
    what += s.key.empty() ? "; valid" : " valid";
    what += " keys " + where + " are ";
    for (size_t i = 0; i < field.children.size(); ++i) {
      what += (i ? ", " : "") + field.children[i].name;
    }
    return what;
  }

  void check_int_list(const YAML::Node& node, const Field& field, const std::string& path,
                      const std::string& help) const {
    if (!node.IsSequence()) {
      fail(path,
           line_of(node) + "expected a list of integers" + help + ", got " + describe_node(node));
    }
    if (node.size() == 0) fail(path, line_of(node) + "must not be empty" + help);
    for (size_t i = 0; i < node.size(); ++i) {
      const YAML::Node e = node[i];
      const std::string entry = line_of(e) + "entry " + std::to_string(i) + " must be ";
      long long v = 0;
      bool parses = e.IsScalar() && parse_int(e.Scalar(), v);
      if (!parses || e.Tag() == "!") {
        fail(path,
             entry + "an integer" + help + ", got " + describe_node(e) + unquote_hint(e, parses));
      }
      if (!field.range.contains(static_cast<double>(v))) {
        fail(path, entry + field.range.describe() + help + ", got " + describe_node(e));
      }
    }
  }

  const std::string& file_;
  const CustomLeaf& custom_;
  const std::vector<std::string> keys_;  // every dotted key of the schema, for suggestions
};

void collect_keys(const Field& f, const std::string& path, std::vector<std::string>& out) {
  for (const Field& c : f.children) {
    std::string key = join(path, c.name);  // a copy: out.back() would dangle as out grows
    out.push_back(key);
    collect_keys(c, key, out);
  }
}

std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  return s;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Scalars. yaml-cpp keeps every scalar as its source text; parsing that text ourselves keeps the
// checks strict (8.0 is not an integer, "8" in quotes is not a number) and lets unit scaling
// happen in decimal, so that 3.35 TB/s becomes exactly the double nearest 3.35e12.

bool parse_int(std::string_view s, long long& out) {
  s = number_text(s);
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && end == s.data() + s.size() && !s.empty();
}

// Parses s * 10^exp10 by shifting the decimal exponent rather than multiplying, so the result is
// the correctly rounded SI value of what was written.
bool parse_real(std::string_view s, double& out, int exp10) {
  s = number_text(s);
  if (s.empty()) return false;
  // from_chars also accepts "inf" and "nan"; a hardware figure is never either.
  if (s.find_first_not_of("0123456789.eE+-") != std::string_view::npos) return false;
  std::string text(s);
  if (exp10 != 0) {
    size_t e = text.find_first_of("eE");
    long long written = 0;
    if (e != std::string::npos) {
      if (!parse_int(std::string_view(text).substr(e + 1), written)) return false;
      text.resize(e);
    }
    text += "e" + std::to_string(written + exp10);
  }
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc() && end == text.data() + text.size() && std::isfinite(out);
}

// "line N: ", leading the message the way the YAML syntax errors do.
std::string line_of(const YAML::Node& n) {
  YAML::Mark m = n.Mark();
  return m.is_null() ? std::string() : "line " + std::to_string(m.line + 1) + ": ";
}

// How a node appears in a message: its text when short, or what kind of thing it is. Kept to
// one line whatever the input holds, since every error is a single line.
std::string describe_node(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      return "nothing";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a map";
    case YAML::NodeType::Scalar:
      break;
  }
  std::string s = n.Scalar();
  for (char& c : s)
    if (c == '\n' || c == '\r' || c == '\t') c = ' ';
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  // A quoted (or block) scalar is a string however it reads; say so, since '8' and the
  // string '8' look alike in a message.
  return (n.Tag() == "!" ? "the string '" : "'") + s + "'";
}

std::vector<std::string> dotted_keys(const Field& f) {
  std::vector<std::string> out;
  collect_keys(f, "", out);
  return out;
}

YAML::Node load_document(const std::string& text, const std::string& file,
                         const std::string& expected, bool allow_empty) {
  std::vector<YAML::Node> docs;
  try {
    docs = YAML::LoadAll(text);
  } catch (const YAML::Exception& e) {
    std::string where = e.mark.is_null() ? std::string()
                                         : "line " + std::to_string(e.mark.line + 1) + ", column " +
                                               std::to_string(e.mark.column + 1) + ": ";
    throw ConfigError(file, "yaml", where + one_line(e.msg) + "; fix the YAML syntax there");
  }
  if (docs.empty()) {
    if (allow_empty) return YAML::Node(YAML::NodeType::Null);
    throw ConfigError(file, "yaml", "the document is empty; expected " + expected);
  }
  if (docs.size() > 1)
    throw ConfigError(file, "yaml",
                      "holds " + std::to_string(docs.size()) + " documents; keep one per file");
  return docs.front();
}

void validate(const YAML::Node& doc, const Field& schema, const std::string& file,
              const CustomLeaf& custom) {
  Validator(file, schema, custom).check(doc, schema, "");
}

// Recursion rather than a loop of `n = n[k]`: assigning one yaml-cpp Node to another rebinds the
// underlying tree, which would corrupt the document.
YAML::Node Reader::lookup(const YAML::Node& n, std::string_view path) {
  size_t dot = path.find('.');
  if (dot == std::string_view::npos) return n[std::string(path)];
  return lookup(n[std::string(path.substr(0, dot))], path.substr(dot + 1));
}

int Reader::integer(std::string_view path) const {
  long long v = 0;
  parse_int(node(path).Scalar(), v);
  return static_cast<int>(v);
}

double Reader::si(std::string_view path, int exp10) const {
  double v = 0;
  if (!parse_real(node(path).Scalar(), v, exp10))
    throw ConfigError(file_, std::string(path), "value out of range after unit conversion");
  return v;
}

std::vector<int> Reader::int_list(std::string_view path) const {
  std::vector<int> out;
  for (const auto& e : node(path)) {
    long long v = 0;
    parse_int(e.Scalar(), v);
    out.push_back(static_cast<int>(v));
  }
  return out;
}

void Reader::fail(const std::string& key, const std::string& what) const {
  throw ConfigError(file_, key, line_of(node(key)) + what);
}

}  // namespace nodeemu::schema
