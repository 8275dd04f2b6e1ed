// `nodeemu validate`, `nodeemu run` and `nodeemu compare`: the subcommands that take a recipe.
#include <unistd.h>

#include <iostream>
#include <ostream>

#include "devices/errors.hpp"
#include "emu/cli.hpp"
#include "emu/layer_timing.hpp"
#include "emu/megatron_flags.hpp"
#include "emu/recipe_views.hpp"
#include "emu/report.hpp"
#include "emu/training.hpp"
#include "emu/validate.hpp"

namespace nodeemu::emu {

namespace {

// RECIPE, then any mix of key=value overrides, Megatron flags and this command's own options
// (--name VALUE). `--case NAME` starts a new group of overrides (compare).
struct RecipeArgs {
  std::string recipe;
  std::vector<std::string> overrides;  // before the first --case
  std::vector<std::pair<std::string, std::vector<std::string>>> cases;
  std::map<std::string, std::string> options;
};

RecipeArgs parse(const std::string& command, const std::vector<std::string>& args,
                 const std::vector<std::string>& own_options) {
  RecipeArgs out;
  if (args.empty() || args[0].rfind("--", 0) == 0)
    throw ConfigError("nodeemu " + command, "RECIPE",
                      "name a recipe file first, e.g. configs/recipes/tiny_moe.yaml");
  out.recipe = args[0];
  auto overrides = [&]() -> std::vector<std::string>& {
    return out.cases.empty() ? out.overrides : out.cases.back().second;
  };
  for (std::size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--", 0) == 0) {
      std::string key = a.substr(2), value;
      bool inline_value = false;
      if (auto eq = key.find('='); eq != std::string::npos) {
        value = key.substr(eq + 1);
        key = key.substr(0, eq);
        inline_value = true;
      }
      if (key == "megatron-args") {
        // A launch script's flags, as if typed here.
        if (!inline_value) {
          if (i + 1 >= args.size())
            throw ConfigError("nodeemu " + command, "--megatron-args", "needs a file");
          value = args[++i];
        }
        for (auto& w : read_megatron_args(value)) overrides().push_back(std::move(w));
        continue;
      }
      const bool own = key == "case" ||
                       std::find(own_options.begin(), own_options.end(), key) != own_options.end();
      if (own) {
        if (!inline_value) {
          if (i + 1 >= args.size())
            throw ConfigError("nodeemu " + command, "--" + key, "needs a value");
          value = args[++i];
        }
        if (key == "case") {
          if (command != "compare")
            throw ConfigError("nodeemu " + command, "--case", "only 'compare' takes cases");
          out.cases.push_back({value, {}});
        } else {
          out.options[key] = value;
        }
        continue;
      }
      // A Megatron flag: it and its values (the words up to the next flag or override) go to the
      // recipe, which knows whether the flag takes a value.
      overrides().push_back(a);
      while (i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0 &&
             args[i + 1].find('=') == std::string::npos)
        overrides().push_back(args[++i]);
      continue;
    }
    if (a.find('=') == std::string::npos)
      throw ConfigError("nodeemu " + command, a,
                        "unexpected argument; overrides are section.key=value");
    overrides().push_back(a);
  }
  return out;
}

// The process's own stderr, on a terminal: progress may rewrite a line in place there.
bool is_terminal(const std::ostream& err) {
  return &err == &std::cerr && isatty(STDERR_FILENO);
}

int int_option(const RecipeArgs& a, const std::string& key, int fallback) {
  auto it = a.options.find(key);
  if (it == a.options.end()) return fallback;
  try {
    std::size_t used = 0;
    const int v = std::stoi(it->second, &used);
    if (used == it->second.size() && v > 0) return v;
  } catch (const std::exception&) {
  }
  throw ConfigError("command line", "--" + key,
                    "wants a positive integer, got '" + it->second + "'");
}

// Loads, applies Megatron-Bridge's flex backend rule and validates. Prints every finding; returns
// the recipe, or nothing when it has errors.
std::optional<Recipe> prepared(const std::string& path, const std::vector<std::string>& overrides,
                               const std::map<std::string, std::string>& options, std::ostream& err,
                               const std::string& label, bool apply_flex) {
  std::vector<std::string> all = overrides;
  if (auto m = options.find("mode"); m != options.end())
    all.push_back("emulator.mode=" + m->second);
  Recipe r = Recipe::load(path, all);
  const auto topo = load_topology(r);
  std::vector<Finding> findings;
  if (apply_flex) findings = apply_flex_dispatcher_backend(r, topo->gpu);
  const auto rules = validate(r, topo->gpu, topo->gpus);
  findings.insert(findings.end(), rules.begin(), rules.end());
  for (auto& f : findings)
    if (!label.empty()) f.message += " [case " + label + "]";
  print_findings(findings, err);
  if (has_errors(findings)) return std::nullopt;
  return r;
}

}  // namespace

int validate_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  const RecipeArgs a = parse("validate", args, {"mode"});
  // A validate does not apply the flex fallback: an unsupported backend is an error here.
  const auto r = prepared(a.recipe, a.overrides, a.options, err, "", false);
  if (!r) return 2;
  const auto topo = load_topology(*r);
  const int world = r->int32("nodes") * topo->gpus;
  out << "ok: " << a.recipe << " is valid: " << world << " GPUs of " << topo->name << ", "
      << parallel_layout(*r, world).dp() << "-way data parallel, "
      << microbatches_per_rank(*r, world) << " micro-batches per rank, schedule "
      << make_schedule(*r)->name() << "\n";
  return 0;
}

int run_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  const RecipeArgs a = parse("run", args, {"mode", "trace", "summary", "iterations", "baseline"});
  const auto r = prepared(a.recipe, a.overrides, a.options, err, "", true);
  if (!r) {
    err << "nodeemu run: refused; nothing was started\n";
    return 2;
  }
  TrainOptions o;
  o.iterations = int_option(a, "iterations", 0);
  o.progress = &err;
  o.progress_terminal = is_terminal(err);
  if (auto t = a.options.find("trace"); t != a.options.end()) o.trace_path = t->second;
  RunReport rep = train(*r, o);
  const auto baseline = a.options.find("baseline");
  if (baseline != a.options.end() && baseline->second != "on" && baseline->second != "off")
    throw ConfigError("command line", "--baseline", "is on or off, got '" + baseline->second + "'");
  const bool measure_baseline = baseline == a.options.end() || baseline->second == "on";
  if (measure_baseline && has_memory_savers(*r)) {
    err << "baseline: the same recipe with offload and recompute off, for peak memory\n";
    measure_memory_baseline(*r, o, rep);
  }
  print_summary(rep, out);
  if (!o.trace_path.empty())
    out << "trace written to " << o.trace_path << " (open it in https://ui.perfetto.dev)\n";
  if (auto s = a.options.find("summary"); s != a.options.end()) {
    write_summary_file(rep, *r, s->second);
    out << "summary written to " << s->second << "\n";
  }
  return 0;
}

int compare_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  const RecipeArgs a = parse("compare", args, {"mode", "iterations"});
  if (a.cases.empty())
    throw ConfigError("nodeemu compare", "--case",
                      "give at least one case: --case NAME key=value ...");
  // Every case is checked before any runs.
  std::vector<std::pair<std::string, Recipe>> recipes;
  bool ok = true;
  for (const auto& [name, overrides] : a.cases) {
    std::vector<std::string> all = a.overrides;
    all.insert(all.end(), overrides.begin(), overrides.end());
    auto r = prepared(a.recipe, all, a.options, err, name, true);
    if (r)
      recipes.emplace_back(name, std::move(*r));
    else
      ok = false;
  }
  if (!ok) {
    err << "nodeemu compare: refused; nothing was started\n";
    return 2;
  }
  std::vector<Case> cases;
  for (const auto& [name, r] : recipes) {
    err << "case " << name << ":\n";
    TrainOptions o;
    o.iterations = int_option(a, "iterations", 0);
    o.progress = &err;
    o.progress_terminal = is_terminal(err);
    RunReport rep = train(r, o);
    // Peak memory without offload and recompute: from an earlier case that is this one with
    // both off, else from a baseline run.
    if (has_memory_savers(r)) {
      const auto base = without_memory_savers(r).flattened();
      std::size_t i = 0;
      for (; i < cases.size(); ++i)
        if (without_memory_savers(recipes[i].second).flattened() == base &&
            !has_memory_savers(recipes[i].second))
          break;
      if (i < cases.size()) {
        for (std::size_t d = 0; d < rep.devices.size(); ++d)
          rep.devices[d].peak_mem_without_savers_bytes = cases[i].report.devices[d].peak_mem_bytes;
      } else {
        err << "case " << name << ": baseline with offload and recompute off, for peak memory\n";
        measure_memory_baseline(r, o, rep);
      }
    }
    cases.push_back({name, std::move(rep)});
  }
  print_compare(cases, out);
  return 0;
}

int layer_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  const RecipeArgs a = parse("layer", args, {"json"});
  const auto r = prepared(a.recipe, a.overrides, a.options, err, "", true);
  if (!r) return 2;
  const LayerReport rep = time_layers(*r);
  print_layer_report(rep, out);
  if (auto j = a.options.find("json"); j != a.options.end())
    write_file_atomically(j->second, layer_report_json(rep), "--json");
  return 0;
}

}  // namespace nodeemu::emu
