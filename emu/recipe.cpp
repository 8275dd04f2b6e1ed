#include "emu/recipe.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "devices/check.hpp"
#include "devices/errors.hpp"
#include "emu/megatron_flags.hpp"
#include "emu/recipe_keys.hpp"
#include "schema/yaml_schema.hpp"

namespace nodeemu::emu {

namespace {

// Megatron's --moe-layer-freq expression (its arguments.py evaluates it as Python): sums of list
// literals, each list or parenthesised sum optionally repeated, as in its docstring's
// "([1]*3+[0]*1)*2". The grammar:
//   expr := term ('+' term)*
//   term := atom ('*' N)?
//   atom := '[' N (',' N)* ']' | '(' expr ')'
class PatternParser {
 public:
  explicit PatternParser(std::string text) : text_(std::move(text)) {
    std::erase_if(text_, [](unsigned char c) { return std::isspace(c); });
  }
  std::optional<std::vector<std::string>> parse() {
    std::vector<std::string> out;
    if (!expr(out, 0) || at_ != text_.size() || out.empty()) return std::nullopt;
    return out;
  }

 private:
  static constexpr std::size_t kMostLayers = 100000, kDeepest = 16;
  bool eat(char c) { return at_ < text_.size() && text_[at_] == c && (++at_, true); }
  bool number(std::int64_t& v) {
    const std::size_t from = at_;
    while (at_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[at_]))) ++at_;
    if (at_ == from || at_ - from > 9) return false;
    v = std::stoll(text_.substr(from, at_ - from));
    return true;
  }
  bool expr(std::vector<std::string>& out, std::size_t depth) {
    do {
      if (!term(out, depth)) return false;
    } while (eat('+'));
    return true;
  }
  bool term(std::vector<std::string>& out, std::size_t depth) {
    std::vector<std::string> items;
    if (!atom(items, depth)) return false;
    std::int64_t times = 1;
    if (eat('*') && !number(times)) return false;
    if (items.size() * std::size_t(times) + out.size() > kMostLayers) return false;
    for (std::int64_t r = 0; r < times; ++r) out.insert(out.end(), items.begin(), items.end());
    return true;
  }
  bool atom(std::vector<std::string>& out, std::size_t depth) {
    if (eat('(')) return depth < kDeepest && expr(out, depth + 1) && eat(')');
    if (!eat('[')) return false;
    for (std::int64_t v = 0; !eat(']');) {
      if (!number(v)) return false;
      out.push_back(std::to_string(v));
      if (!eat(',') && (at_ >= text_.size() || text_[at_] != ']')) return false;
    }
    return true;
  }
  std::string text_;
  std::size_t at_ = 0;
};

// The integers, or nothing when the text is not of that form.
std::optional<std::vector<std::string>> expand_pattern(const std::string& text) {
  return PatternParser(text).parse();
}

[[noreturn]] void unknown_key(const std::string& where, const std::string& key) {
  const std::string near = nearest_key(key);
  throw ConfigError(where, key,
                    "unknown key" + (near.empty() ? std::string("; `nodeemu keys` lists them")
                                                  : "; did you mean '" + near + "'?"));
}

std::string choices_text(const KeySpec& k) {
  std::string s;
  for (const auto& c : k.choices) s += (s.empty() ? "" : ", ") + c;
  return s;
}

// Converts one YAML node to the key's type, or throws naming the key.
// `at` leads every message: the value's line in a file ("line 4: "), "" for an override.
Value convert(const KeySpec& k, const YAML::Node& n, const std::string& where,
              const std::string& origin, const std::string& at = "") {
  Value v;
  v.origin = origin;
  auto bad = [&](const std::string& got) -> ConfigError {
    return ConfigError(where, k.key,
                       at + "wants " + std::string(names_of(k.type).wanted) + ", got " + got);
  };
  auto int32_item = [&](std::int64_t x) {
    if (x < INT32_MIN || x > INT32_MAX)
      throw bad("an integer out of range (" + std::to_string(x) + ")");
    return x;
  };
  if (!n || n.IsNull()) {
    // A key with a default has no unset state: below the schema every reader relies on a value.
    if (!k.default_yaml.empty())
      throw ConfigError(
          where, k.key,
          at + "needs a value (its default is " + k.default_yaml + "; remove the key to use it)");
    return v;  // unset
  }
  v.null = false;
  if (k.type == ValueType::LayerPattern) {
    if (n.IsMap()) throw bad("a mapping");
    if (n.IsScalar()) {
      std::int64_t every = 0;
      if (YAML::convert<std::int64_t>::decode(n, every)) {
        v.list = {std::to_string(int32_item(every))};
      } else if (auto l = expand_pattern(n.Scalar())) {
        v.list = std::move(*l);
      } else {
        throw bad("'" + n.Scalar() + "'");
      }
      return v;
    }
    for (const auto& e : n) {
      std::int64_t x = 0;
      if (!e.IsScalar() || !YAML::convert<std::int64_t>::decode(e, x))
        throw bad("a list of non-integers");
      v.list.push_back(std::to_string(int32_item(x)));
    }
    return v;
  }
  const bool list = k.type == ValueType::StringList || k.type == ValueType::IntList;
  if (list != n.IsSequence() || n.IsMap())
    throw bad(n.IsMap() ? "a mapping" : n.IsSequence() ? "a list" : "'" + n.Scalar() + "'");
  try {
    switch (k.type) {
      case ValueType::Bool:
        v.b = n.as<bool>();
        break;
      case ValueType::Int:
        v.i = n.as<std::int64_t>();
        break;
      case ValueType::Float:
        v.f = n.as<double>();
        break;
      case ValueType::String:
        v.s = n.as<std::string>();
        break;
      case ValueType::LayerPattern:  // handled above
      case ValueType::StringList:
      case ValueType::IntList:
        for (const auto& e : n) {
          if (!e.IsScalar()) throw bad("a nested value");
          // Integers are kept in decimal (YAML also reads 0x10 and 1_000), within int32: the
          // readers take them as int.
          v.list.push_back(k.type == ValueType::IntList
                               ? std::to_string(int32_item(e.as<std::int64_t>()))
                               : e.Scalar());
        }
        break;
    }
  } catch (const YAML::Exception&) {
    throw bad("'" + (n.IsScalar() ? n.Scalar() : std::string("...")) + "'");
  }
  const auto allowed = [&](const std::string& s) {
    return k.choices.empty() || std::find(k.choices.begin(), k.choices.end(), s) != k.choices.end();
  };
  if (k.type == ValueType::String && !allowed(v.s))
    throw ConfigError(where, k.key, at + "'" + v.s + "' is not one of " + choices_text(k));
  if (k.type == ValueType::StringList)
    for (const auto& s : v.list)
      if (!allowed(s))
        throw ConfigError(where, k.key, at + "'" + s + "' is not one of " + choices_text(k));
  return v;
}

// Megatron launch flags whose names differ from the key's last part.
const std::map<std::string, std::string>& flag_aliases() {
  static const std::map<std::string, std::string> m = {
      {"num-experts", key::model_num_moe_experts},
      // Megatron-LM's --no-rope-fusion and --no-bias-swiglu-fusion (on by default there).
      {"rope-fusion", key::model_apply_rope_fusion},
      {"bias-swiglu-fusion", key::model_bias_activation_fusion},
      {"num-virtual-stages-per-pipeline-rank", key::model_virtual_pipeline_model_parallel_size},
      {"microbatch-group-size-per-virtual-pipeline-stage",
       key::model_microbatch_group_size_per_vp_stage},
      {"lr", key::optimizer_lr},
      {"seed", key::emulator_seed},
      {"weight-decay", key::optimizer_weight_decay},
  };
  return m;
}

}  // namespace

Recipe::Recipe() {
  for (const auto& k : recipe_schema()) {
    Value v = k.default_yaml.empty()
                  ? Value{}
                  : convert(k, YAML::Load(k.default_yaml), "recipe schema", "default");
    v.origin = "default";
    values_[k.key] = std::move(v);
  }
}

Recipe Recipe::parse(const std::string& yaml_text, const std::string& name,
                     const std::vector<std::string>& overrides, BadOverrides bad) {
  Recipe r;
  r.name_ = name;
  // The shared walker finds syntax errors, unknown and repeated keys and misplaced maps, with
  // their lines; each key's value is converted here, by its KeySpec.
  const YAML::Node root =
      schema::load_document(yaml_text, name, "a map of sections (model, train, ...)",
                            /*allow_empty=*/true);
  if (!root.IsNull())
    schema::validate(root, recipe_document_schema(), name,
                     [&](const schema::Field&, const YAML::Node& n, const std::string& key,
                         const std::string& at) {
                       r.values_[key] = convert(*find_key(key), n, name, "recipe", at);
                     });
  auto is_flag = [&](std::size_t i) { return overrides[i].rfind("--", 0) == 0; };
  for (std::size_t i = 0; i < overrides.size();) {
    const bool flag = is_flag(i);
    try {
      if (flag) {
        i += r.set_flag(overrides, i);
      } else {
        r.set(overrides[i]);
        ++i;
      }
    } catch (const ConfigError& e) {
      if (bad == BadOverrides::Throw) throw;
      r.override_errors_.push_back(e);
      // A flag that failed leaves its values behind: the words up to the next flag or
      // assignment.
      ++i;
      while (flag && i < overrides.size() && !is_flag(i) &&
             overrides[i].find('=') == std::string::npos)
        ++i;
    }
  }
  r.apply_megatron_defaults();
  return r;
}

// Megatron-LM's command-line defaults where they differ from the schema's
// (megatron/training/arguments.py: --no-gradient-accumulation-fusion, --no-bias-swiglu-fusion
// and --no-rope-fusion are store_false, so each fusion is on unless the script says otherwise;
// --clip-grad defaults to 1.0). Only keys that nothing set take them.
void Recipe::apply_megatron_lm_argument_defaults() {
  static const std::pair<const char*, const char*> kDefaults[] = {
      {key::model_gradient_accumulation_fusion, "true"},
      {key::model_bias_activation_fusion, "true"},
      {key::model_apply_rope_fusion, "true"},
      {key::optimizer_clip_grad, "1.0"},
  };
  for (const auto& [k, v] : kDefaults)
    if (values_[k].origin == "default") set(k, v, kMegatronLmDefault);
}

void Recipe::apply_megatron_defaults() {
  if (text(key::emulator_argument_defaults) == "megatron_lm") apply_megatron_lm_argument_defaults();
  // Megatron-LM's validate_args turns --sequence-parallel off at TP 1 with a warning, so a
  // pasted launch script runs there; set as a recipe key it stays an error, as Megatron-Bridge
  // has it.
  const Value& sp = values_[key::model_sequence_parallel];
  if (sp.b && sp.origin.rfind("--", 0) == 0 &&
      integer(key::model_tensor_model_parallel_size) == 1) {
    values_[key::model_sequence_parallel].b = false;
    flag_warnings_.push_back({sp.origin,
                              "turned off at tensor_model_parallel_size 1, as "
                              "Megatron-LM does (nothing to shard the sequence over)"});
  }
  // Megatron-LM's command line reads --num-query-groups only with --group-query-attention;
  // without it attention has a key/value head per query head (argument_utils.py,
  // core_transformer_config_from_args).
  if (values_[key::model_num_query_groups].origin == "--num-query-groups" &&
      !group_query_attention_flag_) {
    set(key::model_num_query_groups, "null", kMegatronLmDefault);
    flag_warnings_.push_back({"--num-query-groups",
                              "ignored without --group-query-attention, as Megatron-LM does: "
                              "multi-head attention; add --group-query-attention for GQA"});
  }
  // The schedule changes no kernel, but the functional plane's losses would not be Megatron's:
  // it steps at the constant optimizer.lr.
  if (text(key::emulator_mode) == "functional")
    for (const std::string& f : lr_schedule_flags_)
      refused_flags_.push_back(
          {f.substr(0, f.find(' ')),
           "the functional plane steps at the constant optimizer.lr, so its losses would not "
           "follow this schedule; remove it, or run in meta mode (emulator.mode=meta), where the "
           "schedule has no effect on timing"});
}

Recipe Recipe::load(const std::string& path, const std::vector<std::string>& overrides,
                    BadOverrides bad) {
  std::ifstream in(path);
  if (!in) throw ConfigError(path, "", "cannot read the recipe file; check the path");
  std::stringstream ss;
  ss << in.rdbuf();
  // Errors name the file; the recipe is then known by its stem.
  Recipe r = parse(ss.str(), path, overrides, bad);
  r.name_ = std::filesystem::path(path).stem().string();
  r.path_ = path;
  r.dir_ = std::filesystem::path(path).parent_path().string();
  return r;
}

void Recipe::set(const std::string& assignment) {
  const auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    throw ConfigError("override", assignment,
                      "write overrides as section.key=value, e.g. model.num_layers=4");
  set(assignment.substr(0, eq), assignment.substr(eq + 1), assignment);
}

void Recipe::set(const std::string& key, const std::string& yaml_value, const std::string& origin) {
  const KeySpec* spec = find_key(key);
  if (!spec) unknown_key("override", key);
  YAML::Node n;
  try {
    // A per-layer pattern in Megatron's expression form ("[1]*3+[0]*1") is not YAML: its text.
    if (spec->type == ValueType::LayerPattern && yaml_value.find('*') != std::string::npos)
      n = YAML::Node(yaml_value);
    else
      n = YAML::Load(yaml_value.empty() ? "null" : yaml_value);
  } catch (const YAML::Exception&) {
    throw ConfigError("override", key, "cannot read the value '" + yaml_value + "'");
  }
  try {
    Value v = convert(*spec, n, "override", origin);
    // A key the user sets twice (an override, then a flag of a --megatron-args file): the later
    // one wins, as Megatron's argparse takes the last, and the user hears of it.
    auto by_user = [](const std::string& o) {
      return o.rfind("--", 0) == 0 || o.find('=') != std::string::npos;
    };
    const std::string& before = values_[key].origin;
    if (by_user(before) && by_user(origin) && before != origin)
      flag_warnings_.push_back(
          {origin, "sets " + key + " again, after " + before + "; the later one wins"});
    values_[key] = std::move(v);
  } catch (const ConfigError& e) {
    // A launch flag's value: name the flag the user wrote, and the key it sets.
    if (origin.rfind("--", 0) != 0) throw;
    throw ConfigError("command line", origin + " (" + key + ")", e.detail());
  }
}

std::size_t Recipe::set_flag(const std::vector<std::string>& args, std::size_t i) {
  std::string flag = args[i].substr(2), inline_value;
  bool has_inline = false;
  if (auto eq = flag.find('='); eq != std::string::npos) {
    inline_value = flag.substr(eq + 1);
    flag = flag.substr(0, eq);
    has_inline = true;
  }
  bool negate = false;
  auto lookup = [](const std::string& f) -> const KeySpec* {
    if (auto a = flag_aliases().find(f); a != flag_aliases().end()) return find_key(a->second);
    std::string name = f;
    std::replace(name.begin(), name.end(), '-', '_');
    const KeySpec* hit = nullptr;
    for (const auto& k : recipe_schema()) {
      const auto dot = k.key.rfind('.');
      if ((dot == std::string::npos ? k.key : k.key.substr(dot + 1)) == name) hit = &k;
    }
    return hit;
  };
  const KeySpec* spec = lookup(flag);
  if (!spec && flag.rfind("no-", 0) == 0) {
    spec = lookup(flag.substr(3));
    negate = spec && spec->type == ValueType::Bool;
    if (!negate) spec = nullptr;
  }
  if (!spec) {
    if (const MegatronFlag* m = find_megatron_flag(flag))
      return take_megatron_flag(*m, args, i, has_inline ? &inline_value : nullptr);
    std::string underscored = flag;
    std::replace(underscored.begin(), underscored.end(), '-', '_');
    const std::string near = nearest_key(underscored);
    throw ConfigError("command line", "--" + flag,
                      "not a Megatron flag NodeEmu knows" +
                          (near.empty() ? std::string("") : "; did you mean '" + near + "'?"));
  }
  if (spec->type == ValueType::Bool && !has_inline) {
    set(spec->key, negate ? "false" : "true", "--" + flag);
    return 1;
  }
  if (has_inline) {
    set(spec->key, inline_value, "--" + flag);
    return 1;
  }
  if (i + 1 >= args.size()) throw ConfigError("command line", "--" + flag, "needs a value");
  // Megatron's list flags take several words: --recompute-modules core_attn moe_act.
  if (spec->type == ValueType::StringList || spec->type == ValueType::IntList) {
    std::size_t j = i + 1;
    std::string items;
    while (j < args.size() && args[j].rfind("--", 0) != 0 && args[j].find('=') == std::string::npos)
      items += (items.empty() ? "" : ", ") + args[j++];
    set(spec->key, "[" + items + "]", "--" + flag);
    return j - i;
  }
  if (args[i + 1].rfind("$", 0) == 0)
    throw ConfigError("command line", "--" + flag,
                      "has the shell variable " + args[i + 1] + " for a value; write the value");
  set(spec->key, args[i + 1], "--" + flag);
  return 2;
}

std::size_t Recipe::take_megatron_flag(const MegatronFlag& m, const std::vector<std::string>& args,
                                       std::size_t i, const std::string* inline_value) {
  std::vector<std::string> values;
  std::size_t used = 1;
  if (inline_value) {
    values.push_back(*inline_value);
  } else {
    const std::size_t most = m.values < 0 ? args.size() : i + 1 + std::size_t(m.values);
    for (std::size_t j = i + 1; j < args.size() && j < most && args[j].rfind("--", 0) != 0; ++j)
      values.push_back(args[j]), ++used;
  }
  const std::string flag = "--" + m.name;
  if (m.values > 0 && values.size() != std::size_t(m.values))
    throw ConfigError("command line", flag, "needs a value");
  std::string said = flag;
  for (const auto& v : values) said += " " + v;
  switch (m.kind) {
    case MegatronFlag::Kind::Io:
      flags_without_effect_.push_back(said);
      break;
    case MegatronFlag::Kind::LrSchedule:
      flags_without_effect_.push_back(said);
      lr_schedule_flags_.push_back(said);
      break;
    case MegatronFlag::Kind::Refused:
      refused_flags_.push_back({flag, m.why});
      break;
    case MegatronFlag::Kind::Model: {
      if (m.name == "group-query-attention") group_query_attention_flag_ = true;
      const std::string given = values.empty() ? "" : values.front();
      auto same = [](const std::string& a, const std::string& b) {
        char* end_a = nullptr;
        char* end_b = nullptr;
        const double x = std::strtod(a.c_str(), &end_a), y = std::strtod(b.c_str(), &end_b);
        if (!a.empty() && !b.empty() && *end_a == 0 && *end_b == 0) return x == y;
        return a == b;
      };
      if (!m.models.empty() && !same(given, m.models))
        refused_flags_.push_back(
            {flag, "is " + given + "; NodeEmu models " + m.why + ": set " + flag + " " + m.models});
      else if (!m.key.empty())
        set(m.key, m.key_value, flag);
      break;
    }
  }
  return used;
}

std::string Recipe::resolve(const std::string& relative) const {
  namespace fs = std::filesystem;
  if (fs::path(relative).is_absolute()) return relative;
  // Recipes live in configs/recipes/ and name topologies as "topologies/x.yaml".
  for (const fs::path& base : {fs::path(dir_), fs::path(dir_).parent_path(), fs::path(".")}) {
    const fs::path p = base / relative;
    if (fs::exists(p)) return p.string();
  }
  return relative;
}

const Value& Recipe::value(const std::string& key) const {
  auto it = values_.find(key);
  NE_CHECK(it != values_.end(), ("recipe key '" + key + "' is not in the schema").c_str());
  return it->second;
}

const Value& Recipe::checked(const std::string& key, ValueType want) const {
  const KeySpec* spec = find_key(key);
  NE_CHECK(spec && spec->type == want, ("recipe key '" + key + "' read as the wrong type").c_str());
  return value(key);
}

bool Recipe::is_set(const std::string& key) const {
  return !value(key).null;
}
bool Recipe::flag(const std::string& key) const {
  return checked(key, ValueType::Bool).b;
}
std::int64_t Recipe::integer(const std::string& key) const {
  return checked(key, ValueType::Int).i;
}
int Recipe::int32(const std::string& key) const {
  const std::int64_t v = integer(key);
  if (v < INT32_MIN || v > INT32_MAX) throw ConfigError(name_, key, "is out of range");
  return static_cast<int>(v);
}
double Recipe::real(const std::string& key) const {
  return checked(key, ValueType::Float).f;
}
const std::string& Recipe::text(const std::string& key) const {
  return checked(key, ValueType::String).s;
}
const std::vector<std::string>& Recipe::list(const std::string& key) const {
  return checked(key, ValueType::StringList).list;
}
std::vector<int> Recipe::int_list(const std::string& key) const {
  const KeySpec* spec = find_key(key);
  const bool pattern = spec && spec->type == ValueType::LayerPattern;
  std::vector<int> out;
  for (const auto& s : checked(key, pattern ? ValueType::LayerPattern : ValueType::IntList).list)
    out.push_back(std::stoi(s));
  return out;
}
bool Recipe::list_has(const std::string& key, const std::string& item) const {
  const auto& l = list(key);
  return std::find(l.begin(), l.end(), item) != l.end();
}

std::string to_yaml(const Value& v, ValueType t) {
  if (v.null) return "null";
  std::ostringstream os;
  switch (t) {
    case ValueType::Bool:
      return v.b ? "true" : "false";
    case ValueType::Int:
      return std::to_string(v.i);
    case ValueType::Float:
      os << v.f;
      return os.str();
    case ValueType::String:
      return v.s;
    case ValueType::LayerPattern:
    case ValueType::StringList:
    case ValueType::IntList: {
      std::string s;
      for (const auto& e : v.list) s += (s.empty() ? "" : ", ") + e;
      return "[" + s + "]";
    }
  }
  return "?";
}

std::map<std::string, std::string> Recipe::flattened() const {
  std::map<std::string, std::string> out;
  for (const auto& k : recipe_schema()) out[k.key] = to_yaml(value(k.key), k.type);
  return out;
}

ValueTypeNames names_of(ValueType t) {
  switch (t) {
    case ValueType::Bool:
      return {"bool", "true or false"};
    case ValueType::Int:
      return {"int", "an integer"};
    case ValueType::Float:
      return {"float", "a number"};
    case ValueType::String:
      return {"string", "a string"};
    case ValueType::StringList:
      return {"[string]", "a list of names, e.g. [a, b]"};
    case ValueType::IntList:
      return {"[int]", "a list of integers, e.g. [2, 1]"};
    case ValueType::LayerPattern:
      return {"pattern",
              "an integer N (every Nth layer) or one 0/1 per layer: [0, 1, 1] or "
              "\"([0]*1+[1]*2)\""};
  }
  NE_CHECK(false, "names_of: a ValueType without names");
  return {"?", "?"};
}

}  // namespace nodeemu::emu
