#include "emu/representative_ranks.hpp"

#include <algorithm>

#include "devices/errors.hpp"
#include "emu/recipe_keys.hpp"

namespace nodeemu::emu {

namespace {

// Whether some NIC serves both a rank that runs and one that does not: the skipped rank's own
// collectives (another replica's tensor-parallel group, say) would then be missing from a link
// a running rank uses.
bool nic_shared_across(const std::vector<int>& representative_of, const NodeTopology& t) {
  const int gpus = t.gpus, nics = t.nic.per_node;
  if (nics <= 0 || nics >= gpus) return false;
  const int per_nic = (gpus + nics - 1) / nics;
  const int world = int(representative_of.size());
  for (int first = 0; first < world; first += per_nic) {
    const int last = std::min(world, first + per_nic);
    bool any_runs = false, any_skipped = false;
    for (int r = first; r < last; ++r) {
      // A NIC's GPUs are consecutive within a node; a node's GPU count is a multiple of per_nic.
      (representative_of[std::size_t(r)] == r ? any_runs : any_skipped) = true;
    }
    if (any_runs && any_skipped) return true;
  }
  return false;
}

}  // namespace

RankSelection select_ranks(const Recipe& r, const ProcessGroups& pg, const NodeOptions& node) {
  const std::string asked = r.text(key::emulator_ranks);
  const int world = pg.layout().world;
  const bool meta = node.mode == Mode::Meta;
  RankSelection s;
  if (asked == "all" || (asked == "auto" && (!meta || world <= kRepresentativeAbove))) {
    for (int rank = 0; rank < world; ++rank) s.running.push_back(rank);
    return s;
  }
  if (!meta) throw ConfigError(r.name(), key::emulator_ranks, kRepresentativeNeedsMeta);
  s.representative_of.resize(std::size_t(world));
  for (int rank = 0; rank < world; ++rank) {
    // Megatron's data-parallel group holds the ranks of one TP/CP/PP coordinate; its first
    // member (data-parallel rank 0) runs for all of them.
    const std::vector<int>& dp = pg.group_of(GroupKind::DP, rank);
    s.representative_of[std::size_t(rank)] = dp.front();
    if (dp.front() == rank) s.running.push_back(rank);
  }
  if (nic_shared_across(s.representative_of, *node.topology)) {
    if (asked == "representative")
      throw ConfigError(r.name(), key::emulator_ranks,
                        "representative ranks need each NIC's GPUs all to run or all to be "
                        "skipped, but '" +
                            node.topology->name +
                            "' shares a NIC between data-parallel replicas here; set "
                            "emulator.ranks: all");
    s.representative_of.clear();
    s.running.clear();
    for (int rank = 0; rank < world; ++rank) s.running.push_back(rank);
    return s;
  }
  s.representative = int(s.running.size()) < world;
  if (!s.representative) s.representative_of.clear();
  return s;
}

}  // namespace nodeemu::emu
