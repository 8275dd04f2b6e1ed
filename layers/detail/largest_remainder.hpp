// Internal (layers/meta_routing.cpp, layers/detail/central_limit_counts.cpp): real-valued
// expert loads rounded to whole tokens that keep their total, by largest remainders.
#pragma once
#include <cstdint>
#include <vector>

namespace nodeemu::layers::detail {

// Integers within [0, cap] summing to `total`, each the floor of its `want` (taken within
// [0, cap]) or one more: the largest fractional parts get the units the floors left, ties to the
// lower index, so the result is deterministic. Requires cap * want.size() >= total.
std::vector<std::int64_t> round_to_total(const std::vector<double>& want, std::int64_t total,
                                         std::int64_t cap);

}  // namespace nodeemu::layers::detail
