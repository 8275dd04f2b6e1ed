// Representative ranks (Communicator::represent): which members of a group run, and whom each
// stands for. The emulator runs one data-parallel replica of a large layout; the other replicas
// run the same program on statistically equal work, and their traffic rides on the running
// members' calls (issue 53).
#include <algorithm>

#include "comm/comm_state.hpp"
#include "devices/check.hpp"
#include "devices/errors.hpp"
#include "devices/node.hpp"

namespace nodeemu {
namespace detail {

const GroupState::Standing* GroupState::standing(const std::vector<int>& representative_of,
                                                 const OpName& op) {
  if (standing_known_) return standing_ ? &*standing_ : nullptr;
  Standing s;
  s.stands_for.resize(ranks.size());
  bool skipped = false;
  for (std::size_t m = 0; m < ranks.size(); ++m) {
    const int rep = representative_of[std::size_t(ranks[m])];
    if (rep == ranks[m]) {
      ++s.simulated;
      continue;
    }
    skipped = true;
    const auto it = std::find(ranks.begin(), ranks.end(), rep);
    if (it == ranks.end())
      throw UsageError(op.text() + ": rank " + std::to_string(ranks[m]) +
                       " does not run (representative ranks), and rank " + std::to_string(rep) +
                       ", which runs in its place, is not in the group to carry its traffic; run "
                       "every rank (emulator.ranks: all)");
    s.stands_for[std::size_t(it - ranks.begin())].push_back(int(m));
  }
  standing_known_ = true;
  if (skipped) standing_ = std::move(s);
  return standing_ ? &*standing_ : nullptr;
}

const std::vector<int>& CommState::stands_for(GroupState& g, int me, const OpName& op) {
  static const std::vector<int> none;
  if (representative_of.empty()) return none;
  const GroupState::Standing* s = g.standing(representative_of, op);
  return s ? s->stands_for[std::size_t(me)] : none;
}

}  // namespace detail

void Communicator::represent(std::vector<int> representative_of) {
  Node& node = *state_->node;
  if (node.mode() == Mode::Functional)
    throw UsageError(
        "Communicator::represent: functional mode moves every rank's real bytes; representative "
        "ranks are for meta mode");
  if (int(representative_of.size()) != node.device_count())
    throw UsageError("Communicator::represent: " + std::to_string(representative_of.size()) +
                     " entries for " + std::to_string(node.device_count()) +
                     " devices; give one per device");
  for (std::size_t r = 0; r < representative_of.size(); ++r) {
    const int rep = representative_of[r];
    if (rep < 0 || rep >= node.device_count() || representative_of[std::size_t(rep)] != rep)
      throw UsageError("Communicator::represent: rank " + std::to_string(r) + "'s representative " +
                       std::to_string(rep) + " is not a rank that runs itself");
  }
  state_->representative_of = std::move(representative_of);
}

bool Communicator::runs(int rank) const {
  const auto& rep = state_->representative_of;
  return rep.empty() || rep[std::size_t(rank)] == rank;
}

}  // namespace nodeemu
