// Shared by the emu tests: the shipped tiny recipe with overrides.
#pragma once
#include <string>
#include <vector>

#include "emu/recipe.hpp"

#ifndef NODEEMU_SOURCE_DIR
#define NODEEMU_SOURCE_DIR "."
#endif

namespace nodeemu::testing {

inline std::string recipe_path(const std::string& name) {
  return std::string(NODEEMU_SOURCE_DIR) + "/configs/recipes/" + name + ".yaml";
}

inline emu::Recipe tiny(const std::vector<std::string>& overrides = {}) {
  return emu::Recipe::load(recipe_path("tiny_moe"), overrides);
}

}  // namespace nodeemu::testing
