#include "devices/detail/memory_account.hpp"

#include <algorithm>

#include "devices/check.hpp"

namespace nodeemu::detail {

void MemoryAccount::allocate(VTime t, std::uint64_t bytes) {
  NE_CHECK(fits(bytes), "an allocation was booked past the device's capacity");
  live_ += bytes;
  book(t, static_cast<std::int64_t>(bytes));
}

void MemoryAccount::release(VTime t, std::uint64_t bytes, bool was_deferred) {
  NE_CHECK(bytes <= live_ && (!was_deferred || bytes <= deferred_),
           "more memory released than was allocated");
  live_ -= bytes;
  if (was_deferred) deferred_ -= bytes;
  book(t, -static_cast<std::int64_t>(bytes));
}

void MemoryAccount::book(VTime t, std::int64_t delta) {
  for (std::size_t last : {last_allocation_, last_release_})
    if (last != SIZE_MAX && deltas_[last].first == t) {
      deltas_[last].second += delta;
      return;
    }
  (delta >= 0 ? last_allocation_ : last_release_) = deltas_.size();
  deltas_.emplace_back() = {t, delta};
}

std::uint64_t MemoryAccount::peak(VTime from, VTime to) const {
  std::vector<std::pair<VTime, std::int64_t>> deltas(deltas_.size());
  for (std::size_t i = 0; i < deltas.size(); ++i) deltas[i] = deltas_[i];
  std::stable_sort(deltas.begin(), deltas.end(), [](const auto& x, const auto& y) {
    return x.first != y.first ? x.first < y.first : x.second < y.second;
  });
  std::int64_t cur = 0, peak = 0;
  for (auto& [t, v] : deltas) {
    if (t >= to) break;
    cur += v;
    if (t >= from) peak = std::max(peak, cur);
  }
  std::int64_t at_from = 0;
  for (auto& [t, v] : deltas)
    if (t < from) at_from += v;
  return static_cast<std::uint64_t>(std::max(peak, from > 0 ? at_from : 0));
}

}  // namespace nodeemu::detail
