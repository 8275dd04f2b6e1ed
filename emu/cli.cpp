#include "emu/cli.hpp"

#include <ostream>

#include "devices/errors.hpp"

namespace nodeemu::emu {

namespace {

const char* kUsage =
    "usage: nodeemu <command> [options]\n"
    "commands:\n"
    "  info  [--topology FILE] [--nodes N] [--synthetic-host DESC] [--thread-budget N]\n"
    "        [--bindpcie on|off]\n"
    "        the emulated node, how it maps onto this host (worker pools, each rank's host\n"
    "        thread and pinned memory), and the GEMM kernel in use\n"
    "  demo  [--topology FILE] [--max-connections N] [--trace FILE] [--workers N]\n"
    "        a small two-stream program on every GPU; prints its virtual timeline\n"
    "  validate RECIPE [key=value ...] [--megatron-flag ...] [--megatron-args FILE]\n"
    "        [--mode functional|meta]\n"
    "        check every Megatron-Core / Megatron-Bridge rule; exit 2 with one line per error\n"
    "        (--megatron-args FILE: a launch script's pretrain_gpt.py flags, pasted; also for\n"
    "        run, compare and layer)\n"
    "  run   RECIPE [key=value ...] [--megatron-flag ...] [--mode functional|meta]\n"
    "        [--iterations N] [--trace FILE] [--summary FILE] [--baseline on|off]\n"
    "        train the recipe on the emulated node; prints the summary table (with offload\n"
    "        or recompute on, a baseline run without them gives the peak memory they save)\n"
    "  compare RECIPE [key=value ...] --case NAME key=value ... --case NAME key=value ...\n"
    "        [--iterations N] [--mode functional|meta]: the cases side by side\n"
    "  layer RECIPE [key=value ...] [--megatron-flag ...] [--json FILE]\n"
    "        one micro-batch through one MoE (and one dense) layer on rank 0 (with its TP\n"
    "        group under TP), EP communication left out: forward and forward+backward time,\n"
    "        busy time by kernel class, host issue\n"
    "  cost  --gpu PROFILE TABLE.csv [--explain] [--out FILE]\n"
    "        predict each row of a table in a GPU profile's format (times and rates filled in);\n"
    "        --explain says which measured rows each prediction came from\n"
    "  calibrate DIR [--out PROFILE_DIR] [--name NAME] [--errors FILE.csv]\n"
    "        check a folder written by tools/measure_gpu.py, write a GPU profile from it, and\n"
    "        print each table's leave-one-out error (--errors: every row's, as CSV)\n"
    "  help  this text\n"
    "With no --topology (or no topology: in a recipe), the DGX H100 topology built into the\n"
    "binary is used. Overrides use the recipe's dotted names (model.num_layers=8); Megatron\n"
    "launch flags work too (--overlap-moe-expert-parallel-comm --delay-wgrad-compute).\n";

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
    (args.empty() ? err : out) << kUsage;
    return args.empty() ? 2 : 0;
  }
  std::vector<std::string> rest(args.begin() + 1, args.end());
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
