// Internal to emu (emu/recipe_commands.cpp): the cases of `nodeemu compare`, trained one after
// another or several at once.
//
// Why several at once: a meta-mode case runs on one core (every rank's host program takes turns
// on one thread, and no kernel body runs), so a compare of four full-size cases took four times
// one case's wall time on a machine with cores to spare. Each case has its own Node and recipe;
// cases with the same routing share one routing memo (layers::MetaRouting::SharingScope), whose
// draws are pure functions of their keys. Nothing in a run depends on another run or on the wall
// clock, so every case's report is the same bits whichever way they run
// (tests/emu/case_runs_test.cpp compares them).
// Only what a report says of this machine is shared: the process's peak resident memory and the
// kept blocks' peak (`peak_host_bytes`, `peak_kept_block_bytes`) cover every case running at the
// time, and wall times overlap; the compare table shows none of them.
#pragma once

#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

#include "emu/recipe.hpp"
#include "emu/training.hpp"

namespace nodeemu::emu::detail {

struct NamedRecipe {
  std::string name;
  Recipe recipe;
};

// How many cases `nodeemu compare` trains at once when --jobs is not given: one per core, up to
// the number of cases, when every case is in meta mode; otherwise one (a functional case keeps
// every core busy by itself).
int default_case_jobs(const std::vector<NamedRecipe>& cases);

// Trains every case with `options` (its `progress` stream is where each case reports), `jobs`
// at a time, and returns their reports in the cases' order. Alone (jobs 1), a case's progress is
// written as `train` writes it, after a "case NAME:" line; with several at once, each line of it
// is prefixed with "case NAME: " and written whole. If cases fail, the first failure in the
// cases' order is thrown once every started case has ended.
std::vector<RunReport> train_cases(const std::vector<NamedRecipe>& cases,
                                   const TrainOptions& options, int jobs);

}  // namespace nodeemu::emu::detail
