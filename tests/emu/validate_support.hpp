// Shared by the validate tests: a recipe's findings as lines, and one rule as a pair of recipes
// (one that keeps it and passes, one that breaks it and gets the named line).
#pragma once
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "emu/recipe_views.hpp"
#include "emu/validate.hpp"
#include "tests/emu/emu_test_support.hpp"

namespace nodeemu::testing {

// The tiny recipe's findings, with the overrides, as "error: key: message" lines.
inline std::string check(const std::vector<std::string>& overrides) {
  emu::Recipe r = tiny(overrides);
  const auto topo = emu::load_topology(r);
  std::ostringstream os;
  emu::print_findings(emu::validate(r, topo->gpu, topo->gpus), os);
  return os.str();
}

inline std::vector<std::string> overlap(std::vector<std::string> more) {
  more.insert(more.begin(), "comm_overlap.overlap_moe_expert_parallel_comm=true");
  return more;
}
// CP 2 on the tiny recipe's four GPUs (one hardware queue, as Megatron wants it with CP).
inline std::vector<std::string> cp2(std::vector<std::string> more) {
  more.insert(more.begin(),
              {"model.context_parallel_size=2", "emulator.cuda_device_max_connections=1"});
  return more;
}
inline std::vector<std::string> delayed(std::vector<std::string> more) {
  more.insert(more.begin(), "comm_overlap.delay_wgrad_compute=true");
  return overlap(more);
}

struct Rule {
  const char* name;
  std::vector<std::string> good, bad;
  const char* expected;  // a line of the bad recipe's output
};

// One rule per parameter: its test is in validate_test.cpp; each file instantiates its table.
class Rules : public ::testing::TestWithParam<Rule> {};

}  // namespace nodeemu::testing
