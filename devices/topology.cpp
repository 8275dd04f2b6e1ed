#include "devices/topology.hpp"

#include "devices/edit_distance.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <string_view>
#include <system_error>
#include <tuple>
#include <utility>

#include "devices/errors.hpp"

namespace nodeemu {
namespace {

// ---------------------------------------------------------------------------------------------
// Schema. The file format is described once, as data, so that the unknown/missing/type/range
// checks are one walker instead of an if-chain per key, and so that the "did you mean" list is
// always the real set of keys.

enum class Kind { kMap, kString, kInt, kReal, kIntList };

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

struct Field {
  std::string name;
  Kind kind = Kind::kMap;
  std::string help;  // what the value means and its unit, quoted in error messages
  Range range;
  bool required = true;
  std::vector<Field> children;  // kMap only
};

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
Field optional(Field f) {
  f.required = false;
  return f;
}

const Field& topology_schema() {
  static const Field root = map(
      "",
      {
          str("name", "topology name such as dgx_h100"),
          integer("gpus", "GPUs per node", ints(1, 64)),
          map("gpu",
              {
                  str("name", "GPU model such as H100-SXM5-80GB"),
                  integer("sms", "streaming multiprocessors", ints(1)),
                  real("bf16_tflops", "dense bf16 peak in TFLOP/s", kPositive),
                  real("fp8_tflops", "dense fp8 peak in TFLOP/s, 0 for none", kNonNegative),
                  real("fp32_tflops", "fp32 peak in TFLOP/s", kPositive),
                  // Exactly one of the two; the pair is checked after the walk.
                  optional(real("hbm_gib", "HBM capacity in GiB", kPositive)),
                  optional(real("hbm_gb", "HBM capacity in GB", kPositive)),
                  real("hbm_tb_s", "HBM bandwidth in TB/s", kPositive),
                  str("compute_capability", "\"major.minor\" such as \"9.0\""),
                  map("copy_engines",
                      {
                          integer("h2d", "host-to-device copy engines", ints(1)),
                          integer("d2h", "device-to-host copy engines", ints(1)),
                      }),
                  map("efficiency",
                      {
                          map("compute",
                              {
                                  real("max", "best fraction of peak FLOP/s", kFraction),
                                  real("half_gflop", "GFLOP at which half of max is reached",
                                       kNonNegative),
                              }),
                          map("memory",
                              {
                                  real("max", "best fraction of peak HBM bandwidth", kFraction),
                                  real("half_mb", "MB at which half of max is reached",
                                       kNonNegative),
                              }),
                      }),
                  map("launch",
                      {
                          real("kernel_host_us", "host time of a kernel launch in us",
                               kNonNegative),
                          real("memcpy_host_us", "host time of a cudaMemcpyAsync in us",
                               kNonNegative),
                          real("event_host_us", "host time of an event call in us", kNonNegative),
                          real("sync_host_us", "host time of a synchronize in us", kNonNegative),
                          real("latency_us", "launch-to-start device latency in us", kNonNegative),
                      }),
              }),
          map("host",
              {
                  integer("sockets", "CPU sockets", ints(1)),
                  integer("cores_per_socket", "cores per socket", ints(1)),
                  int_list("numa_socket", "socket of each NUMA node", ints(0)),
                  real("numa_mem_gb_s", "DRAM bandwidth of one NUMA node in GB/s", kPositive),
                  int_list("gpu_numa", "NUMA node of each GPU", ints(0)),
              }),
          map("nvlink",
              {
                  integer("links", "NVLink links per GPU", ints(1)),
                  real("gb_s", "NVLink GB/s per direction per GPU", kPositive),
                  real("efficiency", "achievable fraction of gb_s", kFraction),
                  real("half_kb", "message KB at which half of efficiency is reached",
                       kNonNegative),
                  real("latency_us", "NVLink latency in us", kNonNegative),
              }),
          map("pcie",
              {
                  integer("generation", "PCIe generation", ints(1, 7)),
                  real("h2d_gb_s", "pinned host-to-device GB/s", kPositive),
                  real("d2h_gb_s", "pinned device-to-host GB/s", kPositive),
                  real("latency_us", "PCIe latency in us", kNonNegative),
                  real("pageable_factor", "rate multiplier for pageable memory", kFraction),
                  real("remote_numa_factor", "rate multiplier for far-socket memory", kFraction),
              }),
          map("nic",
              {
                  integer("per_node", "NICs in the node", ints(1)),
                  real("gb_s", "GB/s per direction per NIC", kPositive),
                  real("efficiency", "achievable fraction of gb_s", kFraction),
                  real("half_kb", "message KB at which half of efficiency is reached",
                       kNonNegative),
                  real("latency_us", "network latency in us", kNonNegative),
              }),
          map("comm_kernels",
              {
                  integer("nccl_sms", "SMs an NCCL-like collective kernel holds", ints(1)),
                  integer("deepep_sms", "SMs of DeepEP-like dispatch/combine (even)", ints(2)),
                  integer("hybridep_sms", "SMs of HybridEP-like dispatch/combine", ints(1)),
              }),
      });
  return root;
}

std::string join(const std::string& parent, const std::string& name) {
  return parent.empty() ? name : parent + "." + name;
}

// Every dotted key of the schema, for suggestions.
void collect_paths(const Field& f, const std::string& path, std::vector<std::string>& out) {
  for (const Field& c : f.children) {
    std::string key = join(path, c.name);  // a copy: out.back() would dangle as out grows
    out.push_back(key);
    collect_paths(c, key, out);
  }
}

std::string_view leaf_of(std::string_view path) {
  size_t dot = path.rfind('.');
  return dot == std::string_view::npos ? path : path.substr(dot + 1);
}

struct Suggestion {
  std::string key;         // "" when nothing is close
  bool elsewhere = false;  // found outside the unknown key's own map
};

// The valid key nearest to an unknown one. A typo is most likely a sibling; a correctly spelled
// key at the wrong depth (gpu.latency_us) most likely belongs further down the same branch; only
// then look anywhere. Closeness is judged on the last component, so that a short key is not
// matched to an unrelated one by a shared prefix.
Suggestion suggest_key(const std::string& parent, const std::string& unknown) {
  static const std::vector<std::string> paths = [] {
    std::vector<std::string> v;
    collect_paths(topology_schema(), "", v);
    return v;
  }();
  const std::string wrong = join(parent, unknown);
  const size_t limit = std::max<size_t>(1, (unknown.size() + 2) / 3);
  const std::string prefix = parent.empty() ? "" : parent + ".";
  Suggestion best;
  std::tuple<int, size_t, size_t> best_rank{INT_MAX, 0, 0};
  for (const std::string& path : paths) {
    size_t leaf_d = edit_distance(unknown, leaf_of(path));
    if (leaf_d > limit) continue;
    bool under_parent = path.compare(0, prefix.size(), prefix) == 0;
    bool sibling = under_parent && path.find('.', prefix.size()) == std::string::npos;
    int scope = sibling ? 0 : under_parent ? 1 : 2;
    std::tuple<int, size_t, size_t> rank{scope, leaf_d, edit_distance(wrong, path)};
    if (rank < best_rank) best_rank = rank, best = {path, scope == 2};
  }
  return best;
}

// ---------------------------------------------------------------------------------------------
// Scalars. yaml-cpp keeps every scalar as its source text; parsing that text ourselves keeps the
// checks strict (8.0 is not an integer, "8" in quotes is not a number) and lets unit scaling
// happen in decimal, so that 3.35 TB/s becomes exactly the double nearest 3.35e12.

std::string_view number_text(std::string_view s) {
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  return s;
}

bool parse_int(std::string_view s, long long& out) {
  s = number_text(s);
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && end == s.data() + s.size() && !s.empty();
}

// Parses s * 10^exp10 by shifting the decimal exponent rather than multiplying, so the result is
// the correctly rounded SI value of what was written.
bool parse_real(std::string_view s, double& out, int exp10 = 0) {
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
    case Kind::kIntList:
      return "a list of integers";
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
  explicit Validator(const std::string& file) : file_(file) {}

  void check(const YAML::Node& node, const Field& field, const std::string& path) const {
    if (field.kind == Kind::kMap) return check_map(node, field, path);
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
      check(kv.second, *child, key);
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

  static std::string unknown_key_message(const Field& field, const std::string& path,
                                         const std::string& name) {
    std::string what = "unknown key";
    Suggestion s = suggest_key(path, name);
    if (!s.key.empty()) {
      what += "; did you mean '" + s.key + "'?";
      if (!s.elsewhere) return what;
      // A key that exists only in another map may be a key that this map simply lacks, so the
      // suggestion alone could mislead; say what does belong here too.
      what += " Otherwise";
    }
    what += s.key.empty() ? "; valid" : " valid";
    what +=
        " keys " + (path.empty() ? std::string("at the top level") : "in '" + path + "'") + " are ";
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
};

// ---------------------------------------------------------------------------------------------
// Reading a validated document by dotted key: every lookup here is known to succeed.

class Reader {
 public:
  Reader(const YAML::Node& root, const std::string& file) : root_(root), file_(file) {}

  // Recursion rather than a loop of `n = n[k]`: assigning one yaml-cpp Node to another
  // rebinds the underlying tree, which would corrupt the document.
  static YAML::Node lookup(const YAML::Node& n, std::string_view path) {
    size_t dot = path.find('.');
    if (dot == std::string_view::npos) return n[std::string(path)];
    return lookup(n[std::string(path.substr(0, dot))], path.substr(dot + 1));
  }

  YAML::Node node(std::string_view path) const { return lookup(root_, path); }
  bool has(std::string_view path) const { return node(path).IsDefined(); }
  std::string str(std::string_view path) const { return node(path).Scalar(); }

  int integer(std::string_view path) const {
    long long v = 0;
    parse_int(node(path).Scalar(), v);
    return static_cast<int>(v);
  }

  // The value in SI units: the written number times 10^exp10.
  double si(std::string_view path, int exp10) const {
    double v = 0;
    if (!parse_real(node(path).Scalar(), v, exp10)) {
      throw ConfigError(file_, std::string(path), "value out of range after unit conversion");
    }
    return v;
  }

  std::vector<int> int_list(std::string_view path) const {
    std::vector<int> out;
    for (const auto& e : node(path)) {
      long long v = 0;
      parse_int(e.Scalar(), v);
      out.push_back(static_cast<int>(v));
    }
    return out;
  }

 private:
  const YAML::Node& root_;
  const std::string& file_;
};

constexpr int kGiga = 9, kTera = 12, kMicro = -6, kMega = 6, kKilo = 3;

NodeTopology build(const YAML::Node& doc, const std::string& file) {
  Validator(file).check(doc, topology_schema(), "");
  Reader r(doc, file);
  auto fail = [&](const std::string& key, const std::string& what) {
    throw ConfigError(file, key, line_of(r.node(key)) + what);
  };

  NodeTopology t;
  t.file = file;
  t.name = r.str("name");
  t.gpus = r.integer("gpus");

  GpuSpec& g = t.gpu;
  g.name = r.str("gpu.name");
  g.sms = r.integer("gpu.sms");
  g.bf16_flops = r.si("gpu.bf16_tflops", kTera);
  g.fp8_flops = r.si("gpu.fp8_tflops", kTera);
  g.fp32_flops = r.si("gpu.fp32_tflops", kTera);

  bool gib = r.has("gpu.hbm_gib"), gb = r.has("gpu.hbm_gb");
  if (gib && gb) fail("gpu.hbm_gb", "give only one of gpu.hbm_gib and gpu.hbm_gb");
  if (!gib && !gb) {
    throw ConfigError(file, "gpu.hbm_gib",
                      "missing required key; add gpu.hbm_gib (HBM capacity in GiB) or gpu.hbm_gb "
                      "(in GB) to 'gpu'");
  }
  // GiB scale by a power of two, which is exact in binary, so multiplying loses nothing.
  double hbm = gib ? r.si("gpu.hbm_gib", 0) * 1073741824.0 : r.si("gpu.hbm_gb", kGiga);
  const char* hbm_key = gib ? "gpu.hbm_gib" : "gpu.hbm_gb";
  // Range first: llround of a value past long long is undefined.
  if (hbm >= 0x1p62 || std::llround(hbm) < 1) {
    fail(hbm_key, "HBM capacity rounds to no bytes or is absurdly large; give it in GiB or GB");
  }
  g.hbm_bytes = static_cast<std::uint64_t>(std::llround(hbm));
  g.hbm_bytes_per_s = r.si("gpu.hbm_tb_s", kTera);

  {
    const std::string cc = r.str("gpu.compute_capability");
    // Digits only on each side: "9.0" and "10.0", never "9" or "+9.-1".
    auto digits = [](std::string_view v) {
      return !v.empty() && v.size() <= 2 && v.find_first_not_of("0123456789") == v.npos;
    };
    size_t dot = cc.find('.');
    long long major = 0, minor = 0;
    if (dot == std::string::npos || !digits(std::string_view(cc).substr(0, dot)) ||
        !digits(std::string_view(cc).substr(dot + 1)) ||
        !parse_int(std::string_view(cc).substr(0, dot), major) ||
        !parse_int(std::string_view(cc).substr(dot + 1), minor) || major < 1) {
      fail("gpu.compute_capability", "expected \"major.minor\" such as \"9.0\", got " +
                                         describe_node(r.node("gpu.compute_capability")));
    }
    g.cc_major = static_cast<int>(major);
    g.cc_minor = static_cast<int>(minor);
  }

  g.h2d_copy_engines = r.integer("gpu.copy_engines.h2d");
  g.d2h_copy_engines = r.integer("gpu.copy_engines.d2h");
  g.compute_eff = {r.si("gpu.efficiency.compute.max", 0),
                   r.si("gpu.efficiency.compute.half_gflop", kGiga)};
  g.memory_eff = {r.si("gpu.efficiency.memory.max", 0),
                  r.si("gpu.efficiency.memory.half_mb", kMega)};
  g.kernel_launch_host_s = r.si("gpu.launch.kernel_host_us", kMicro);
  g.memcpy_launch_host_s = r.si("gpu.launch.memcpy_host_us", kMicro);
  g.event_host_s = r.si("gpu.launch.event_host_us", kMicro);
  g.sync_host_s = r.si("gpu.launch.sync_host_us", kMicro);
  g.launch_latency_s = r.si("gpu.launch.latency_us", kMicro);

  HostSpec& h = t.host;
  h.sockets = r.integer("host.sockets");
  h.cores_per_socket = r.integer("host.cores_per_socket");
  h.numa_socket = r.int_list("host.numa_socket");
  h.numa_mem_bytes_per_s = r.si("host.numa_mem_gb_s", kGiga);
  h.gpu_numa = r.int_list("host.gpu_numa");
  for (size_t i = 0; i < h.numa_socket.size(); ++i) {
    if (h.numa_socket[i] >= h.sockets) {
      fail("host.numa_socket", "entry " + std::to_string(i) + " is socket " +
                                   std::to_string(h.numa_socket[i]) + " but host.sockets is " +
                                   std::to_string(h.sockets) + "; use 0.." +
                                   std::to_string(h.sockets - 1));
    }
  }
  if (static_cast<int>(h.gpu_numa.size()) != t.gpus) {
    fail("host.gpu_numa", "has " + std::to_string(h.gpu_numa.size()) + " entries but gpus is " +
                              std::to_string(t.gpus) + "; give the NUMA node of every GPU");
  }
  for (size_t i = 0; i < h.gpu_numa.size(); ++i) {
    if (h.gpu_numa[i] >= h.numa_count()) {
      fail("host.gpu_numa", "entry " + std::to_string(i) + " is NUMA node " +
                                std::to_string(h.gpu_numa[i]) + " but host.numa_socket defines " +
                                std::to_string(h.numa_count()) + "; use 0.." +
                                std::to_string(h.numa_count() - 1));
    }
  }

  t.nvlink.links = r.integer("nvlink.links");
  t.nvlink.bytes_per_s = r.si("nvlink.gb_s", kGiga);
  t.nvlink.efficiency = r.si("nvlink.efficiency", 0);
  t.nvlink.half_bytes = r.si("nvlink.half_kb", kKilo);
  t.nvlink.latency_s = r.si("nvlink.latency_us", kMicro);

  t.pcie.generation = r.integer("pcie.generation");
  t.pcie.h2d_bytes_per_s = r.si("pcie.h2d_gb_s", kGiga);
  t.pcie.d2h_bytes_per_s = r.si("pcie.d2h_gb_s", kGiga);
  t.pcie.latency_s = r.si("pcie.latency_us", kMicro);
  t.pcie.pageable_factor = r.si("pcie.pageable_factor", 0);
  t.pcie.remote_numa_factor = r.si("pcie.remote_numa_factor", 0);

  t.nic.per_node = r.integer("nic.per_node");
  t.nic.bytes_per_s = r.si("nic.gb_s", kGiga);
  t.nic.efficiency = r.si("nic.efficiency", 0);
  t.nic.half_bytes = r.si("nic.half_kb", kKilo);
  t.nic.latency_s = r.si("nic.latency_us", kMicro);

  t.comm.nccl_sms = r.integer("comm_kernels.nccl_sms");
  t.comm.deepep_sms = r.integer("comm_kernels.deepep_sms");
  t.comm.hybridep_sms = r.integer("comm_kernels.hybridep_sms");
  const std::pair<const char*, int> comm_sms[] = {
      {"comm_kernels.nccl_sms", t.comm.nccl_sms},
      {"comm_kernels.deepep_sms", t.comm.deepep_sms},
      {"comm_kernels.hybridep_sms", t.comm.hybridep_sms}};
  for (const auto& [key, v] : comm_sms)
    if (v > t.gpu.sms)
      fail(key, std::to_string(v) + " is more SMs than the GPU has (" + std::to_string(t.gpu.sms) +
                    "); use at most gpu.sms");
  if (t.comm.deepep_sms % 2 != 0)
    fail("comm_kernels.deepep_sms", std::to_string(t.comm.deepep_sms) +
                                        " is odd; DeepEP forms num_sms/2 channels, use an "
                                        "even number such as 20");
  return t;
}

std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  return s;
}

}  // namespace

NodeTopology NodeTopology::from_file(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    throw ConfigError(path, "file",
                      "no such file; pass a topology YAML such as "
                      "configs/topologies/dgx_h100.yaml");
  }
  if (fs::is_directory(path, ec)) {
    throw ConfigError(path, "file", "is a directory; pass a topology YAML file");
  }
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  if (in) text << in.rdbuf();
  if (!in || in.bad()) {
    throw ConfigError(path, "file", "cannot be read; check its permissions");
  }
  return from_yaml(text.str(), path);
}

NodeTopology NodeTopology::from_yaml(const std::string& text, const std::string& file_for_errors) {
  std::vector<YAML::Node> docs;
  try {
    docs = YAML::LoadAll(text);
  } catch (const YAML::Exception& e) {
    std::string where = e.mark.is_null() ? std::string()
                                         : "line " + std::to_string(e.mark.line + 1) + ", column " +
                                               std::to_string(e.mark.column + 1) + ": ";
    throw ConfigError(file_for_errors, "yaml",
                      where + one_line(e.msg) + "; fix the YAML syntax there");
  }
  if (docs.empty()) {
    throw ConfigError(file_for_errors, "yaml",
                      "the document is empty; expected a topology map starting with 'name:'");
  }
  if (docs.size() > 1) {
    throw ConfigError(
        file_for_errors, "yaml",
        "holds " + std::to_string(docs.size()) + " documents; keep one topology per file");
  }
  return build(docs.front(), file_for_errors);
}

}  // namespace nodeemu
