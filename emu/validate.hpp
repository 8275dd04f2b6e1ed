// The recipe rules: Megatron-Core's and Megatron-Bridge's (REFERENCE.md section 4), the parallel
// layout's arithmetic, and what NodeEmu does not model yet. `nodeemu validate` prints every
// finding as one line, "error: <key>: <what is wrong and what to set>", and `nodeemu run`
// refuses a recipe with any error before it starts anything.
#pragma once
#include <iosfwd>
#include <string>
#include <vector>

#include "devices/gpu_spec.hpp"
#include "emu/recipe.hpp"

namespace nodeemu::emu {

struct Finding {
  enum class Level { Error, Warning };
  Level level = Level::Error;
  std::string key;  // the recipe key to change
  std::string message;
};

// Every rule, against the GPU the recipe's topology emulates and its GPU count per node.
std::vector<Finding> validate(const Recipe& recipe, const GpuSpec& gpu, int gpus_per_node);

// Megatron-Bridge's apply_flex_dispatcher_backend: with the flex dispatcher, a backend the GPU
// cannot run falls back to alltoall, and flex forces moe_shared_expert_overlap off. Changes the
// recipe and returns a warning for each change (the caller prints them).
std::vector<Finding> apply_flex_dispatcher_backend(Recipe& recipe, const GpuSpec& gpu);

bool has_errors(const std::vector<Finding>& findings);
// "error: model.x: ..." lines.
void print_findings(const std::vector<Finding>& findings, std::ostream& os);

// "2.6.0a0+git" -> {2, 6, 0}; true when `version` >= `minimum` ("" counts as new enough).
bool version_at_least(const std::string& version, const std::string& minimum);

}  // namespace nodeemu::emu
