#include "schema/nearest_key.hpp"

#include <algorithm>
#include <climits>
#include <tuple>

namespace nodeemu::schema {

namespace {

std::string_view leaf_of(std::string_view path) {
  const std::size_t dot = path.rfind('.');
  return dot == std::string_view::npos ? path : path.substr(dot + 1);
}

}  // namespace

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

Suggestion nearest_key(const std::vector<std::string>& keys, std::string_view parent,
                       std::string_view unknown) {
  const std::string wrong =
      parent.empty() ? std::string(unknown) : std::string(parent) + "." + std::string(unknown);
  const std::size_t limit = std::max<std::size_t>(1, (unknown.size() + 2) / 3);
  const std::string prefix = parent.empty() ? "" : std::string(parent) + ".";
  Suggestion best;
  std::tuple<int, std::size_t, std::size_t> best_rank{INT_MAX, 0, 0};
  for (const std::string& path : keys) {
    const std::size_t leaf_d = edit_distance(unknown, leaf_of(path));
    if (leaf_d > limit) continue;
    const bool under_parent = path.compare(0, prefix.size(), prefix) == 0;
    const bool sibling = under_parent && path.find('.', prefix.size()) == std::string::npos;
    const int scope = sibling ? 0 : under_parent ? 1 : 2;
    const std::tuple<int, std::size_t, std::size_t> rank{scope, leaf_d, edit_distance(wrong, path)};
    if (rank < best_rank) best_rank = rank, best = {path, scope == 2};
  }
  return best;
}

}  // namespace nodeemu::schema
