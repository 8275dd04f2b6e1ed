// `nodeemu`: the subcommands' table (synopsis, what, example, options) and the dispatch. Each
// subcommand's options are parsed by CLI11 (emu/detail/commands.hpp declares them); the
// free-form tail of the recipe commands (overrides, Megatron flags, cases) is theirs.
#include "emu/cli.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <ostream>

#include "devices/errors.hpp"
#include "emu/detail/commands.hpp"
#include "schema/nearest_key.hpp"

namespace nodeemu::emu {

namespace {

// Each subcommand's synopsis, what it does and an example: `nodeemu help` lists them all,
// `nodeemu COMMAND --help` shows one.
struct CommandHelp {
  const char* name;
  const char* synopsis;  // options after the command name
  const char* what;
  const char* example;
  detail::CommandBody (*add)(CLI::App&, detail::Streams);
};

const std::vector<CommandHelp>& commands() {
  static const std::vector<CommandHelp> c = {
      {"info", "[options]",
       "the emulated node, how it maps onto this host (worker pools, each rank's host\n"
       "        thread and pinned memory), and the GEMM kernel in use",
       "nodeemu info --topology configs/topologies/dgx_h200.yaml --nodes 2", detail::add_info},
      {"demo", "[options]", "a small two-stream program on every GPU; prints its virtual timeline",
       "nodeemu demo --trace demo.json", detail::add_demo},
      {"validate", "RECIPE [key=value ...] [--megatron-flag ...] [--megatron-args FILE] [options]",
       "check every Megatron-Core / Megatron-Bridge rule; exit 2 with one line per error\n"
       "        (--megatron-args FILE: a launch script's pretrain_gpt.py flags, pasted; also for\n"
       "        run, compare and layer)",
       "nodeemu validate configs/recipes/qwen3_30b_a3b.yaml model.num_layers=8",
       detail::add_validate},
      {"run", "RECIPE [key=value ...] [--megatron-flag ...] [--megatron-args FILE] [options]",
       "train the recipe on the emulated node; prints the summary table (with offload\n"
       "        or recompute on, a baseline run without them gives the peak memory they save)",
       "nodeemu run configs/recipes/tiny_moe.yaml --iterations 2 --summary out.json",
       detail::add_run},
      {"compare", "RECIPE [key=value ...] --case NAME key=value ... --case NAME ... [options]",
       "the cases side by side (each case: the overrides after its --case)",
       "nodeemu compare configs/recipes/tiny_moe.yaml --case base --case overlap\n"
       "        --overlap-moe-expert-parallel-comm --delay-wgrad-compute",
       detail::add_compare},
      {"layer", "RECIPE [key=value ...] [--megatron-flag ...] [--megatron-args FILE] [options]",
       "one micro-batch through one MoE (and one dense) layer on rank 0 (with its TP\n"
       "        group under TP), EP communication left out: forward and forward+backward time,\n"
       "        busy time by kernel class, host issue",
       "nodeemu layer configs/recipes/qwen3_30b_a3b.yaml --json layer.json", detail::add_layer},
      {"keys", "[SECTION | KEY]",
       "every recipe key with its type, default, allowed values and meaning (SECTION: one\n"
       "        section: model, train, comm_overlap, ddp, optimizer, emulator; KEY: one key)",
       "nodeemu keys comm_overlap", detail::add_keys},
      {"cost", "--gpu PROFILE TABLE.csv [options]",
       "predict each row of a table in a GPU profile's format (times and rates filled in);\n"
       "        --explain says which measured rows each prediction came from",
       "nodeemu cost --gpu configs/gpus/h100_sxm5 my_gemms.csv --explain", detail::add_cost},
      {"comm", "COLLECTIVE [options] | --fit CSV",
       "one collective on the emulated fabric, size by size, as nccl-tests prints it (time,\n"
       "        algbw, busbw), or the flex dispatcher's dispatch or combine; --fit: the fabric's\n"
       "        figures fitted to public nccl-tests points, with each point's leave-one-out error",
       "nodeemu comm all_reduce --nodes 2 -b 1M -e 8G", detail::add_comm},
      {"calibrate", "DIR [options]",
       "check a folder written by tools/measure_gpu.py, write a GPU profile from it, and\n"
       "        print each table's leave-one-out error (--errors: every row's, as CSV)",
       "nodeemu calibrate measured/ --out configs/gpus/my_gpu --name my_gpu",
       detail::add_calibrate},
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
  os << "  help  this text   (nodeemu --version: the version)\n" << kUsageTail;
}

// A subcommand's --help: our synopsis and what it does first, CLI11's list of the options it
// declared, then an example.
class CommandFormatter : public CLI::Formatter {
 public:
  explicit CommandFormatter(const CommandHelp& c) : c_(c) { column_width(28); }
  std::string make_description(const CLI::App*) const override { return ""; }
  std::string make_usage(const CLI::App*, std::string) const override {
    return std::string("usage: nodeemu ") + c_.name + " " + c_.synopsis + "\n        " + c_.what +
           "\n";
  }
  std::string make_footer(const CLI::App*) const override {
    return std::string("example:\n  ") + c_.example + "\n" + kUsageTail;
  }

 private:
  const CommandHelp& c_;
};

int run_command(const CommandHelp& c, const std::vector<std::string>& args, std::ostream& out,
                std::ostream& err) {
  CLI::App app(c.what, std::string("nodeemu ") + c.name);
  app.formatter(std::make_shared<CommandFormatter>(c));
  app.set_help_flag("-h,--help", "this text");
  const detail::CommandBody body = c.add(app, {out, err});
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 reads from the back
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    out << app.help();
    return 0;
  } catch (const CLI::ParseError& e) {
    std::string what = e.what();
    std::replace(what.begin(), what.end(), '\n', ' ');  // every error is one line
    throw ConfigError(std::string("nodeemu ") + c.name, "command line",
                      what + "; see 'nodeemu " + c.name + " --help'");
  }
  return body();
}

}  // namespace

int main(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  if (args.empty() || args[0] == "help" || args[0] == "--help" || args[0] == "-h") {
    print_usage(args.empty() ? err : out);
    return args.empty() ? 2 : 0;
  }
  if (args[0] == "--version" || args[0] == "-V") {
    out << "nodeemu " << NODEEMU_VERSION << "\n";
    return 0;
  }
  const auto& all = commands();
  const auto c =
      std::find_if(all.begin(), all.end(), [&](const CommandHelp& h) { return args[0] == h.name; });
  if (c == all.end()) {
    err << "nodeemu: error: unknown command '" << args[0] << "'";
    // The nearest command within about a third of the word's length, as the loaders suggest keys.
    const CommandHelp* near = nullptr;
    std::size_t best = args[0].size() / 3 + 1;
    for (const auto& h : all)
      if (const std::size_t d = schema::edit_distance(args[0], h.name); d < best)
        best = d, near = &h;
    if (near) err << "; did you mean '" << near->name << "'?";
    err << " The commands are";
    for (const auto& h : all) err << " " << h.name << ",";
    err << " and help\n";
    return 2;
  }
  try {
    return run_command(*c, std::vector<std::string>(args.begin() + 1, args.end()), out, err);
  } catch (const ConfigError& e) {
    err << "nodeemu: error: " << e.what() << "\n";
    return 2;
  } catch (const Error& e) {
    err << "nodeemu: error: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace nodeemu::emu
