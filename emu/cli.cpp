#include "emu/cli.hpp"

#include <ostream>

#include "devices/errors.hpp"

namespace nodeemu::emu {

namespace {

// Each subcommand's synopsis, what it does and an example: `nodeemu help` lists them all,
// `nodeemu COMMAND --help` shows one.
struct CommandHelp {
  const char* name;
  const char* synopsis;  // options after the command name
  const char* what;
  const char* example;
};

const std::vector<CommandHelp>& commands() {
  static const std::vector<CommandHelp> c = {
      {"info",
       "[--topology FILE] [--nodes N] [--synthetic-host DESC] [--thread-budget N]\n"
       "        [--workers N] [--bindpcie on|off]",
       "the emulated node, how it maps onto this host (worker pools, each rank's host\n"
       "        thread and pinned memory), and the GEMM kernel in use",
       "nodeemu info --topology configs/topologies/dgx_h200.yaml --nodes 2"},
      {"demo",
       "[--topology FILE] [--nodes N] [--max-connections N] [--size N] [--trace FILE]\n"
       "        [--workers N] [--thread-budget N] [--synthetic-host DESC]",
       "a small two-stream program on every GPU; prints its virtual timeline",
       "nodeemu demo --trace demo.json"},
      {"validate",
       "RECIPE [key=value ...] [--megatron-flag ...] [--megatron-args FILE]\n"
       "        [--mode functional|meta]",
       "check every Megatron-Core / Megatron-Bridge rule; exit 2 with one line per error\n"
       "        (--megatron-args FILE: a launch script's pretrain_gpt.py flags, pasted; also for\n"
       "        run, compare and layer)",
       "nodeemu validate configs/recipes/qwen3_30b_a3b.yaml model.num_layers=8"},
      {"run",
       "RECIPE [key=value ...] [--megatron-flag ...] [--mode functional|meta]\n"
       "        [--iterations N] [--trace FILE] [--summary FILE] [--baseline on|off]",
       "train the recipe on the emulated node; prints the summary table (with offload\n"
       "        or recompute on, a baseline run without them gives the peak memory they save)",
       "nodeemu run configs/recipes/tiny_moe.yaml --iterations 2 --summary out.json"},
      {"compare",
       "RECIPE [key=value ...] --case NAME key=value ... --case NAME key=value ...\n"
       "        [--iterations N] [--mode functional|meta]",
       "the cases side by side",
       "nodeemu compare configs/recipes/tiny_moe.yaml --case base --case overlap\n"
       "        --overlap-moe-expert-parallel-comm --delay-wgrad-compute"},
      {"layer", "RECIPE [key=value ...] [--megatron-flag ...] [--json FILE]",
       "one micro-batch through one MoE (and one dense) layer on rank 0 (with its TP\n"
       "        group under TP), EP communication left out: forward and forward+backward time,\n"
       "        busy time by kernel class, host issue",
       "nodeemu layer configs/recipes/qwen3_30b_a3b.yaml --json layer.json"},
      {"cost", "--gpu PROFILE TABLE.csv [--explain] [--out FILE]",
       "predict each row of a table in a GPU profile's format (times and rates filled in);\n"
       "        --explain says which measured rows each prediction came from",
       "nodeemu cost --gpu configs/gpus/h100_sxm5 my_gemms.csv --explain"},
      {"calibrate", "DIR [--out PROFILE_DIR] [--name NAME] [--errors FILE.csv]",
       "check a folder written by tools/measure_gpu.py, write a GPU profile from it, and\n"
       "        print each table's leave-one-out error (--errors: every row's, as CSV)",
       "nodeemu calibrate measured/ --out configs/gpus/my_gpu --name my_gpu"},
  };
  return c;
}

const char* kUsageTail =
    "With no --topology (or no topology: in a recipe), the DGX H100 topology built into the\n"
    "binary is used. Overrides use the recipe's dotted names (model.num_layers=8); Megatron\n"
    "launch flags work too (--overlap-moe-expert-parallel-comm --delay-wgrad-compute).\n";

void print_usage(std::ostream& os) {
  os << "usage: nodeemu <command> [options]   (nodeemu <command> --help: one command)\n"
        "commands:\n";
  for (const auto& c : commands()) {
    const std::string head = std::string("  ") + c.name + " ";
    os << head << std::string(head.size() < 8 ? 8 - head.size() : 0, ' ') << c.synopsis << "\n"
       << "        " << c.what << "\n";
  }
  os << "  help  this text\n" << kUsageTail;
}

bool wants_help(const std::vector<std::string>& args) {
  for (const auto& a : args)
    if (a == "--help" || a == "-h") return true;
  return false;
}

}  // namespace

Flags::Flags(std::string command, const std::vector<std::string>& args,
             const std::vector<std::string>& known)
    : command_(std::move(command)) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--", 0) != 0)
      throw ConfigError("nodeemu " + command_, a,
                        "unexpected argument; see 'nodeemu help' for the options");
    std::string key = a.substr(2), value;
    if (auto eq = key.find('='); eq != std::string::npos) {
      value = key.substr(eq + 1);
      key = key.substr(0, eq);
    } else {
      if (i + 1 >= args.size())
        throw ConfigError("nodeemu " + command_, "--" + key, "needs a value");
      value = args[++i];
    }
    bool ok = false;
    for (auto& k : known) ok = ok || k == key;
    if (!ok) {
      std::string list;
      for (auto& k : known) list += (list.empty() ? "--" : ", --") + k;
      throw ConfigError("nodeemu " + command_, "--" + key,
                        "unknown option; '" + command_ + "' takes " + list);
    }
    values_.emplace_back(key, value);
  }
}

bool Flags::has(const std::string& key) const {
  for (auto& [k, v] : values_)
    if (k == key) return true;
  return false;
}

std::string Flags::get(const std::string& key, const std::string& fallback) const {
  std::string r = fallback;
  for (auto& [k, v] : values_)
    if (k == key) r = v;
  return r;
}

int Flags::get_int(const std::string& key, int fallback) const {
  if (!has(key)) return fallback;
  std::string v = get(key, "");
  try {
    size_t used = 0;
    int x = std::stoi(v, &used);
    if (used != v.size()) throw std::invalid_argument(v);
    return x;
  } catch (const std::exception&) {
    throw ConfigError("nodeemu " + command_, "--" + key, "wants an integer, got '" + v + "'");
  }
}

int main(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  if (args.empty() || args[0] == "help" || args[0] == "--help" || args[0] == "-h") {
    print_usage(args.empty() ? err : out);
    return args.empty() ? 2 : 0;
  }
  std::vector<std::string> rest(args.begin() + 1, args.end());
  if (wants_help(rest))
    for (const auto& c : commands())
      if (args[0] == c.name) {
        out << "usage: nodeemu " << c.name << " " << c.synopsis << "\n        " << c.what
            << "\nexample:\n  " << c.example << "\n"
            << kUsageTail;
        return 0;
      }
  try {
    if (args[0] == "info") return info_command(rest, out, err);
    if (args[0] == "demo") return demo_command(rest, out, err);
    if (args[0] == "validate") return validate_command(rest, out, err);
    if (args[0] == "run") return run_command(rest, out, err);
    if (args[0] == "compare") return compare_command(rest, out, err);
    if (args[0] == "layer") return layer_command(rest, out, err);
    if (args[0] == "cost") return cost_command(rest, out, err);
    if (args[0] == "calibrate") return calibrate_command(rest, out, err);
    err << "nodeemu: error: unknown command '" << args[0]
        << "'; the commands are info, demo, validate, run, compare, layer, cost, calibrate and "
           "help\n";
    return 2;
  } catch (const ConfigError& e) {
    err << "nodeemu: error: " << e.what() << "\n";
    return 2;
  } catch (const Error& e) {
    err << "nodeemu: error: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace nodeemu::emu
