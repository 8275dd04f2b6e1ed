// Which ranks a run simulates (emulator.ranks, issue 53). Data-parallel replicas run the same
// program on statistically equal work, so a large meta run can simulate one replica (the ranks of
// data-parallel index 0, every TP/CP/PP coordinate) and let each stand for the ranks with its
// coordinates in the other replicas: their share of every collective they take part in rides on
// its calls (comm/communicator.hpp, Communicator::represent), and the report gives them its
// figures.
#pragma once

#include <string>
#include <vector>

#include "comm/parallel_layout.hpp"
#include "devices/node.hpp"
#include "emu/recipe.hpp"

namespace nodeemu::emu {

// `auto` runs representative ranks from this many GPUs up.
inline constexpr int kRepresentativeAbove = 64;

struct RankSelection {
  bool representative = false;
  std::vector<int> representative_of;  // per rank; empty: every rank runs
  std::vector<int> running;            // the ranks that run, ascending
};

// Why functional mode runs every rank: validate's error and select_ranks' ConfigError.
inline constexpr const char* kRepresentativeNeedsMeta =
    "representative ranks need emulator.mode: meta (functional mode moves every rank's real "
    "bytes); set emulator.ranks: all";

// Throws ConfigError (emulator.ranks) for representative ranks in functional mode, or where a NIC
// is shared by a rank that runs and one that does not (the skipped one's traffic there would be
// missing).
RankSelection select_ranks(const Recipe& r, const ProcessGroups& pg, const NodeOptions& node);

}  // namespace nodeemu::emu
