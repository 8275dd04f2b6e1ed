// `nodeemu validate`, `nodeemu run` and `nodeemu compare`: the subcommands that take a recipe.
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <charconv>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <ostream>
#include <set>

#include "devices/errors.hpp"
#include "emu/detail/case_runs.hpp"
#include "emu/detail/commands.hpp"
#include "emu/layer_timing.hpp"
#include "emu/megatron_flags.hpp"
#include "emu/recipe_keys.hpp"
#include "emu/recipe_views.hpp"
#include "emu/report.hpp"
#include "emu/training.hpp"
#include "emu/validate.hpp"

namespace nodeemu::emu {

namespace {

// RECIPE, then any mix of key=value overrides, Megatron flags and this command's own options.
// CLI11 takes the options it knows; the rest stays in order in `tail`, where `--case NAME` starts
// a new group of overrides (compare) and `--megatron-args FILE` stands for a launch script's
// flags, so that a later override wins over an earlier one as on Megatron's command line.
struct RecipeArgs {
  std::string recipe;
  std::vector<std::string> tail;
  std::vector<std::string> overrides;  // before the first --case
  std::vector<std::pair<std::string, std::vector<std::string>>> cases;
  std::string mode, trace, summary, json, baseline = "on";
  std::optional<std::string> trace_gpus;  // given, even empty (which is refused)
  int iterations = 0;                     // 0: the recipe's train_iters
  int jobs = 0;                           // compare: cases at once; 0: default_case_jobs

  void split_tail(const std::string& command);
};

void RecipeArgs::split_tail(const std::string& command) {
  auto group = [&]() -> std::vector<std::string>& {
    return cases.empty() ? overrides : cases.back().second;
  };
  for (std::size_t i = 0; i < tail.size(); ++i) {
    const std::string& a = tail[i];
    if (a.rfind("--", 0) != 0) {
      if (a.find('=') == std::string::npos)
        throw ConfigError("nodeemu " + command, a,
                          "unexpected argument; overrides are section.key=value");
      group().push_back(a);
      continue;
    }
    std::string key = a.substr(2), value;
    const auto eq = key.find('=');
    if (eq != std::string::npos) value = key.substr(eq + 1), key.resize(eq);
    const auto take_value = [&](const char* what) {
      if (eq != std::string::npos) return;
      if (i + 1 >= tail.size()) throw ConfigError("nodeemu " + command, "--" + key, what);
      value = tail[++i];
    };
    if (key == "megatron-args") {
      take_value("needs a file");
      // The flags are Megatron-LM's: so are the defaults of what they leave out.
      group().push_back(std::string(key::emulator_argument_defaults) + "=megatron_lm");
      for (auto& w : read_megatron_args(value)) group().push_back(std::move(w));
    } else if (key == "case") {
      if (command != "compare")
        throw ConfigError("nodeemu " + command, "--case", "only 'compare' takes cases");
      take_value("needs a name");
      cases.push_back({value, {}});
    } else {
      // A Megatron flag: it and its values (the words up to the next flag or override) go to
      // the recipe, which knows whether the flag takes a value.
      group().push_back(a);
      while (i + 1 < tail.size() && tail[i + 1].rfind("--", 0) != 0 &&
             tail[i + 1].find('=') == std::string::npos)
        group().push_back(tail[++i]);
    }
  }
}

// The process's own stderr, on a terminal: progress may rewrite a line in place there.
bool is_terminal(const std::ostream& err) {
  return &err == &std::cerr && isatty(STDERR_FILENO);
}

// The options every recipe command takes; `own` adds the command's.
std::shared_ptr<RecipeArgs> add_recipe_args(CLI::App& app) {
  auto a = std::make_shared<RecipeArgs>();
  app.add_option("recipe", a->recipe, "the recipe file (configs/recipes/*.yaml)")
      ->type_name("FILE")
      ->required();
  // Overrides, Megatron flags, --megatron-args and --case are kept in order for split_tail.
  app.allow_extras();
  return a;
}

void add_mode(CLI::App& app, RecipeArgs& a) {
  app.add_option("--mode", a.mode, "functional or meta, for this run (the recipe's emulator.mode)")
      ->type_name("MODE")
      ->check(CLI::IsMember({"functional", "meta"}));
}

void add_iterations(CLI::App& app, RecipeArgs& a) {
  app.add_option("--iterations", a.iterations, "iterations to run (default: train.train_iters)")
      ->check(CLI::Range(1, std::numeric_limits<int>::max()));
}

// The remaining words of the command line, split (CLI11 has parsed the rest by now).
RecipeArgs& finish(CLI::App& app, RecipeArgs& a, const std::string& command) {
  a.tail = app.remaining();
  a.split_tail(command);
  return a;
}

// Loads, applies Megatron-Bridge's flex backend rule and validates. Prints every finding; returns
// the recipe, or nothing when it has errors.
std::optional<Recipe> prepared(const std::string& path, const std::vector<std::string>& overrides,
                               const std::string& mode, std::ostream& err, const std::string& label,
                               bool apply_flex) {
  std::vector<std::string> all = overrides;
  if (!mode.empty()) all.push_back(std::string(key::emulator_mode) + "=" + mode);
  Recipe r = Recipe::load(path, all, Recipe::BadOverrides::Collect);
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

int validate(const RecipeArgs& a, std::ostream& out, std::ostream& err) {
  // A validate does not apply the flex fallback: an unsupported backend is an error here.
  const auto r = prepared(a.recipe, a.overrides, a.mode, err, "", false);
  if (!r) return 2;
  const RunPlan plan(*r, {});
  out << "ok: " << a.recipe << " is valid: " << plan.world << " GPUs of "
      << plan.node.topology->name << ", " << plan.dp_size << "-way data parallel, "
      << plan.microbatches << " micro-batches per rank, schedule "
      << make_schedule(plan.schedule)->name() << "\n";
  return 0;
}

// "0-7,64" -> 0..7 and 64, in the order given, each once.
std::vector<int> gpu_list(const std::string& text) {
  const auto bad = [&] {
    return ConfigError("nodeemu run", "--trace-gpus",
                       "'" + text + "' is not a list of GPU numbers and ranges; write e.g. 0-7,64");
  };
  std::vector<int> out;
  std::set<int> seen;
  std::size_t at = 0;
  const auto number = [&] {
    int v = 0;
    const char* first = text.data() + at;
    const auto [end, ec] = std::from_chars(first, text.data() + text.size(), v);
    if (ec != std::errc() || end == first) throw bad();
    at += std::size_t(end - first);
    return v;
  };
  while (true) {
    const int lo = number();
    int hi = lo;
    if (at < text.size() && text[at] == '-') ++at, hi = number();
    // No run has a million GPUs: a larger number is a typo, not a range to walk.
    if (hi < lo || hi >= 1'000'000) throw bad();
    for (int g = lo; g <= hi; ++g)
      if (seen.insert(g).second) out.push_back(g);
    if (at == text.size()) return out;
    if (text[at] != ',') throw bad();
    ++at;
  }
}

int run(const RecipeArgs& a, std::ostream& out, std::ostream& err) {
  const auto r = prepared(a.recipe, a.overrides, a.mode, err, "", true);
  if (!r) {
    err << "nodeemu run: refused; nothing was started\n";
    return 2;
  }
  TrainOptions o;
  o.iterations = a.iterations;
  o.progress = &err;
  o.progress_terminal = is_terminal(err);
  o.trace_path = a.trace;
  if (a.trace_gpus) o.trace_gpus = gpu_list(*a.trace_gpus);
  RunReport rep = train(*r, o);
  if (a.baseline == "on" && has_memory_savers(*r)) {
    err << "baseline: the same recipe with offload and recompute off, for peak memory\n";
    measure_memory_baseline(*r, o, rep);
  }
  print_summary(rep, out);
  if (!o.trace_path.empty())
    out << "trace written to " << o.trace_path
        << (a.trace_gpus ? " (GPUs " + *a.trace_gpus + ")" : "")
        << " (open it in https://ui.perfetto.dev)\n";
  if (!a.summary.empty()) {
    write_summary_file(rep, *r, a.summary);
    out << "summary written to " << a.summary << "\n";
  }
  return 0;
}

int compare(const RecipeArgs& a, std::ostream& out, std::ostream& err) {
  if (a.cases.empty())
    throw ConfigError("nodeemu compare", "--case",
                      "give at least one case: --case NAME key=value ...");
  // Every case is checked before any runs.
  std::vector<detail::NamedRecipe> recipes;
  bool ok = true;
  for (const auto& [name, overrides] : a.cases) {
    std::vector<std::string> all = a.overrides;
    all.insert(all.end(), overrides.begin(), overrides.end());
    auto r = prepared(a.recipe, all, a.mode, err, name, true);
    if (r)
      recipes.push_back({name, std::move(*r)});
    else
      ok = false;
  }
  if (!ok) {
    err << "nodeemu compare: refused; nothing was started\n";
    return 2;
  }
  TrainOptions o;
  o.iterations = a.iterations;
  o.progress = &err;
  o.progress_terminal = is_terminal(err);
  const int jobs =
      std::min<int>(a.jobs > 0 ? a.jobs : detail::default_case_jobs(recipes), int(recipes.size()));
  if (jobs > 1)
    err << "nodeemu compare: " << recipes.size() << " cases, " << jobs
        << " at once (--jobs 1: one after another)\n";
  std::vector<RunReport> reports = detail::train_cases(recipes, o, jobs);
  std::vector<Case> cases;
  for (std::size_t c = 0; c < recipes.size(); ++c) {
    const auto& [name, r] = recipes[c];
    RunReport& rep = reports[c];
    // Peak memory without offload and recompute: from an earlier case that is this one with
    // both off, else from a baseline run.
    if (has_memory_savers(r)) {
      const auto base = without_memory_savers(r).flattened();
      std::size_t i = 0;
      for (; i < cases.size(); ++i)
        if (without_memory_savers(recipes[i].recipe).flattened() == base &&
            !has_memory_savers(recipes[i].recipe))
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

int layer(const RecipeArgs& a, std::ostream& out, std::ostream& err) {
  const auto r = prepared(a.recipe, a.overrides, "", err, "", true);
  if (!r) return 2;
  const LayerReport rep = time_layers(RunPlan(*r, {}));
  print_layer_report(rep, out);
  if (!a.json.empty()) write_file_atomically(a.json, layer_report_json(rep), "--json");
  return 0;
}

}  // namespace

detail::CommandBody detail::add_validate(CLI::App& app, Streams io) {
  auto a = add_recipe_args(app);
  add_mode(app, *a);
  return [a, &app, io] { return validate(finish(app, *a, "validate"), io.out, io.err); };
}

detail::CommandBody detail::add_run(CLI::App& app, Streams io) {
  auto a = add_recipe_args(app);
  add_mode(app, *a);
  add_iterations(app, *a);
  auto* trace =
      app.add_option("--trace", a->trace, "write the run's Chrome trace here")->type_name("FILE");
  app.add_option("--trace-gpus", a->trace_gpus,
                 "only these GPUs (global ranks, e.g. 0-7,64) and their hosts in the trace: a "
                 "full-size run's trace of every GPU does not fit in memory")
      ->type_name("LIST")
      ->needs(trace);
  app.add_option("--summary", a->summary, "write the summary as JSON here")->type_name("FILE");
  app.add_option("--baseline", a->baseline,
                 "with offload or recompute on, also run without them for the peak memory they "
                 "save")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  return [a, &app, io] { return run(finish(app, *a, "run"), io.out, io.err); };
}

detail::CommandBody detail::add_compare(CLI::App& app, Streams io) {
  auto a = add_recipe_args(app);
  add_mode(app, *a);
  add_iterations(app, *a);
  app.add_option("--jobs", a->jobs,
                 "cases trained at once (default: in meta mode one per core, up to the number "
                 "of cases, each with its own memory; in functional mode 1)")
      ->check(CLI::Range(1, 1024));
  return [a, &app, io] { return compare(finish(app, *a, "compare"), io.out, io.err); };
}

detail::CommandBody detail::add_layer(CLI::App& app, Streams io) {
  auto a = add_recipe_args(app);
  app.add_option("--json", a->json, "write the report as JSON here")->type_name("FILE");
  return [a, &app, io] { return layer(finish(app, *a, "layer"), io.out, io.err); };
}

}  // namespace nodeemu::emu
