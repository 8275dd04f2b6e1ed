// A recipe: what to emulate and how to train it, in Megatron-Bridge's own key names so that a
// user can copy settings across (sections model, comm_overlap, train, ddp, optimizer), plus
// NodeEmu's `emulator` section and the top-level `topology` and `nodes`.
//
//   Recipe r = Recipe::load("configs/recipes/tiny_moe.yaml",
//                           {"comm_overlap.overlap_moe_expert_parallel_comm=true",
//                            "--delay-wgrad-compute"});
//   int ep = r.integer("model.expert_model_parallel_size");  // or key::model_expert_...
//
// Every key has a type and a default in one schema (emu/recipe_schema.cpp). An unknown key, in the
// file or on the command line, is a ConfigError that names it and suggests the nearest known one;
// a value of the wrong type names the key and the type it wants. Keys are always the full dotted
// name ("model.num_layers"); emu/recipe_keys.hpp names each one.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "schema/errors.hpp"

namespace nodeemu::schema {
struct Field;
}

namespace nodeemu::emu {

struct MegatronFlag;

// LayerPattern: Megatron's moe_layer_freq, an integer N (every Nth layer) or one 0/1 per layer,
// as a list or as Megatron's Python expression ("([0]*3+[1]*58)"); stored as integers.
enum class ValueType { Bool, Int, Float, String, StringList, IntList, LayerPattern };
// How a type is named: `column` in `nodeemu keys` ("[int]"), `wanted` in a type error ("a list
// of integers, e.g. [2, 1]"). One table, so a new type gets both names: a missing case is a
// -Wswitch warning at build time and an invariant failure if reached.
struct ValueTypeNames {
  const char* column;
  const char* wanted;
};
ValueTypeNames names_of(ValueType t);

struct KeySpec {
  std::string key;  // key::model_num_layers
  ValueType type;
  std::string default_yaml;          // "" = unset (null) by default
  std::vector<std::string> choices;  // for strings: the allowed values (empty = any)
  std::string help;
};

// The schema, in section order.
const std::vector<KeySpec>& recipe_schema();
const KeySpec* find_key(const std::string& key);
// The keys that never change the emulated run, by design: the recipe's text and the host's
// resources. A run's summary names those a recipe sets.
const std::vector<std::string>& keys_without_effect();
// The schema key nearest to `key` (schema/nearest_key.hpp: a sibling first, then the same name
// in another section); "" when nothing is close.
std::string nearest_key(const std::string& key);
// The recipe file's shape for the schema walker (schema/yaml_schema.hpp): the sections as maps of
// the keys, every key a custom leaf that Recipe converts by its KeySpec.
const schema::Field& recipe_document_schema();
// The recipe key of a layers::ModelConfig or ParallelLayout field, whose names are Megatron's
// (a ConfigError from their validate() names the field): "num_layers" -> "model.num_layers".
std::string model_key(const std::string& field);

struct Value {
  bool null = true;
  bool b = false;
  std::int64_t i = 0;
  double f = 0;
  std::string s;
  std::vector<std::string> list;  // StringList, IntList and LayerPattern (as text)
  std::string origin;             // "recipe", "default", or the override that set it
};

// The origin of a value that Megatron-LM's command line defaults (emulator.argument_defaults).
inline constexpr const char* kMegatronLmDefault = "Megatron-LM's default";

class Recipe {
 public:
  // What becomes of an override or launch flag that cannot be applied (an unknown flag or key, a
  // value of the wrong type, a flag without its value): Throw, the first one's ConfigError; or
  // Collect, each kept in override_errors() and the rest applied, so that the command line
  // reports every problem of a pasted launch script in one run (validate adds them).
  enum class BadOverrides { Throw, Collect };
  // Reads a YAML file and applies `overrides` in order: "section.key=value" (a YAML scalar or a
  // flow list, "[a,b]") or Megatron launch flags ("--delay-wgrad-compute",
  // "--pipeline-model-parallel-size 2", "--no-bf16"). Throws ConfigError naming the file or key
  // (the file's own problems always; the overrides' as `bad` says).
  static Recipe load(const std::string& path, const std::vector<std::string>& overrides = {},
                     BadOverrides bad = BadOverrides::Throw);
  static Recipe parse(const std::string& yaml_text, const std::string& name,
                      const std::vector<std::string>& overrides = {},
                      BadOverrides bad = BadOverrides::Throw);
  // The overrides and flags that could not be applied, in the order given (BadOverrides::Collect).
  const std::vector<ConfigError>& override_errors() const { return override_errors_; }

  // "section.key=value".
  void set(const std::string& assignment);
  // A key's value from YAML text (as an override would give it).
  void set(const std::string& key, const std::string& yaml_value, const std::string& origin);
  // Megatron launch flags, starting at args[i]; returns how many arguments were used. A flag
  // that names no key is taken by its MegatronFlag entry (emu/megatron_flags.hpp).
  std::size_t set_flag(const std::vector<std::string>& args, std::size_t i);
  // Launch flags about data, checkpoints and logging, as given ("--data-path /x"): accepted,
  // and named in the run summary as without effect.
  const std::vector<std::string>& flags_without_effect() const { return flags_without_effect_; }
  // Launch flags NodeEmu refuses, and why (validate reports each), and what it changed to be
  // Megatron-LM's own reading of the flags (validate warns).
  struct FlagNote {
    std::string flag, message;
  };
  const std::vector<FlagNote>& refused_flags() const { return refused_flags_; }
  const std::vector<FlagNote>& flag_warnings() const { return flag_warnings_; }

  const std::string& name() const { return name_; }  // file stem, e.g. "tiny_moe"
  const std::string& path() const { return path_; }  // the file it came from ("" if parsed)
  // Directory that relative paths in the recipe (topology) are resolved against.
  std::string resolve(const std::string& relative) const;

  bool is_set(const std::string& key) const;  // not null
  bool flag(const std::string& key) const;
  std::int64_t integer(const std::string& key) const;
  int int32(const std::string& key) const;
  double real(const std::string& key) const;
  const std::string& text(const std::string& key) const;  // "" when null
  const std::vector<std::string>& list(const std::string& key) const;
  std::vector<int> int_list(const std::string& key) const;  // IntList or LayerPattern
  bool list_has(const std::string& key, const std::string& item) const;
  const Value& value(const std::string& key) const;
  // Every key with its value as YAML text, for the summary.
  std::map<std::string, std::string> flattened() const;

 private:
  Recipe();
  const Value& checked(const std::string& key, ValueType want) const;
  std::size_t take_megatron_flag(const MegatronFlag& m, const std::vector<std::string>& args,
                                 std::size_t i, const std::string* inline_value);
  void apply_megatron_defaults();
  void apply_megatron_lm_argument_defaults();

  std::string name_, path_, dir_;
  std::map<std::string, Value> values_;
  std::vector<std::string> flags_without_effect_;
  std::vector<std::string> lr_schedule_flags_;  // as given, for the functional-mode refusal
  bool group_query_attention_flag_ = false;     // --group-query-attention was given
  std::vector<FlagNote> refused_flags_, flag_warnings_;
  std::vector<ConfigError> override_errors_;
};

// The YAML text of a value ("null", "true", "4", "[a, b]").
std::string to_yaml(const Value& v, ValueType t);

}  // namespace nodeemu::emu
