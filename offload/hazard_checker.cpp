#include "offload/hazard_checker.hpp"

#include <algorithm>

namespace nodeemu::offload {

OffloadHazard::OffloadHazard(const std::string& tensor, int layer, int microbatch,
                             const std::string& what)
    : Error("offload hazard: " + tensor + " (layer " + std::to_string(layer) + ", micro-batch " +
            std::to_string(microbatch) + "): " + what),
      tensor_(tensor),
      layer_(layer),
      microbatch_(microbatch) {}

void HazardChecker::merge(Clock& into, const Clock& from) {
  for (const auto& [k, v] : from) into[k] = std::max(into[k], v);
}

HazardChecker::Stamp HazardChecker::issue(const Stream& s) {
  const void* id = s.state();
  return {id, ++streams_[id][id]};
}

void HazardChecker::record(const Stream& s, const Event& e) {
  events_[&e] = streams_[s.state()];
}

void HazardChecker::wait(const Stream& s, const Event& e) {
  auto it = events_.find(&e);
  if (it != events_.end()) merge(streams_[s.state()], it->second);
}

void HazardChecker::synchronize() {
  Clock all;
  for (const auto& [id, c] : streams_) merge(all, c);
  for (auto& [id, c] : streams_) c = all;
}

bool HazardChecker::ordered(const Stamp& op, const Stream& s) const {
  if (!op.stream || op.stream == s.state()) return true;  // a stream is in order with itself
  auto it = streams_.find(s.state());
  if (it == streams_.end()) return false;
  auto c = it->second.find(op.stream);
  return c != it->second.end() && c->second >= op.seq;
}

}  // namespace nodeemu::offload
