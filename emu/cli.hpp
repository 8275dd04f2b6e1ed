// The `nodeemu` command line. Each subcommand returns the process exit code: 0 on success,
// 2 for bad input (one line on stderr naming the file, key or flag), 1 for a failed run.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

namespace nodeemu::emu {

int main(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

// The topology shipped inside the binary (configs/topologies/dgx_h100.yaml at build time), so
// that `nodeemu` works from any directory.
const std::string& embedded_default_topology();

}  // namespace nodeemu::emu
