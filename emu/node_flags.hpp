// Building a Node from the flags that several subcommands share.
#pragma once

#include <memory>

#include "devices/node.hpp"
#include "emu/cli.hpp"

namespace nodeemu::emu {

// --topology FILE (default: the embedded DGX H100), --nodes, --synthetic-host, --thread-budget,
// --workers, --max-connections.
NodeOptions node_options_from(const Flags& flags);

}  // namespace nodeemu::emu
