// The "did you mean" of every loader: the valid dotted key nearest to an unknown one.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace nodeemu::schema {

struct Suggestion {
  std::string key;         // "" when nothing is close
  bool elsewhere = false;  // found outside the unknown key's own map
};

// `keys` are every valid dotted key; `parent` is the map the unknown name was found in ("" for
// the top level). A typo is most likely a sibling; a correctly spelled key at the wrong depth
// (gpu.latency_us) most likely belongs further down the same branch; only then look anywhere
// (train.num_layers -> model.num_layers). Closeness is judged on the last component, so that a
// short key is not matched to an unrelated one by a shared prefix; farther than about a third of
// the name is no suggestion.
Suggestion nearest_key(const std::vector<std::string>& keys, std::string_view parent,
                       std::string_view unknown);

// Levenshtein distance.
std::size_t edit_distance(std::string_view a, std::string_view b);

}  // namespace nodeemu::schema
