#include "layers/detail/largest_remainder.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

#include "devices/check.hpp"

namespace nodeemu::layers::detail {

std::vector<std::int64_t> round_to_total(const std::vector<double>& want, std::int64_t total,
                                         std::int64_t cap) {
  const std::size_t E = want.size();
  NE_CHECK(E > 0 && cap * std::int64_t(E) >= total && total >= 0,
           "round_to_total: the total does not fit");
  std::vector<std::int64_t> out(E, 0);
  std::int64_t given = 0;
  std::vector<std::pair<double, std::size_t>> rest;
  rest.reserve(E);
  for (std::size_t e = 0; e < E; ++e) {
    const double w = std::clamp(want[e], 0.0, double(cap));
    out[e] = std::min(cap, std::int64_t(std::floor(w)));
    given += out[e];
    rest.emplace_back(w - double(out[e]), e);
  }
  // Largest remainders first; ties to the lower index.
  std::stable_sort(rest.begin(), rest.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  for (std::size_t i = 0; given < total; i = (i + 1) % E) {
    const std::size_t e = rest[i].second;
    if (out[e] < cap) ++out[e], ++given;
  }
  // Wants summing above the total: take from the smallest remainders.
  for (std::size_t i = E; given > total; i = i == 0 ? E : i) {
    const std::size_t e = rest[--i].second;
    if (out[e] > 0) --out[e], --given;
  }
  return out;
}

}  // namespace nodeemu::layers::detail
