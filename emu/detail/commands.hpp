// Internal to emu: the subcommands behind `nodeemu` (emu/cli.cpp). Each `add_*` declares its
// options on a CLI11 app (which parses them and prints --help) and returns what runs the command
// once they are parsed: the exit code, 0 on success, 2 for bad input, 1 for a failed run.
#pragma once

#include <functional>
#include <iosfwd>

namespace CLI {
class App;
}

namespace nodeemu::emu::detail {

struct Streams {
  std::ostream& out;
  std::ostream& err;
};

using CommandBody = std::function<int()>;

CommandBody add_info(CLI::App& app, Streams io);
CommandBody add_demo(CLI::App& app, Streams io);
CommandBody add_validate(CLI::App& app, Streams io);
CommandBody add_run(CLI::App& app, Streams io);
CommandBody add_compare(CLI::App& app, Streams io);
CommandBody add_layer(CLI::App& app, Streams io);
CommandBody add_cost(CLI::App& app, Streams io);
CommandBody add_calibrate(CLI::App& app, Streams io);
CommandBody add_keys(CLI::App& app, Streams io);
CommandBody add_comm(CLI::App& app, Streams io);

}  // namespace nodeemu::emu::detail
