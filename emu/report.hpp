// How a run is shown: the summary table on the terminal, the JSON summary for scripts and CI
// (DESIGN.md lists its keys), and the table `nodeemu compare` prints.
#pragma once
#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

#include "emu/recipe.hpp"
#include "emu/training.hpp"

namespace nodeemu::emu {

void print_summary(const RunReport& r, std::ostream& os);
void write_summary_json(const RunReport& r, const Recipe& recipe, std::ostream& os);
// Writes to a temporary file and renames it, so a failed run never leaves half a summary.
void write_summary_file(const RunReport& r, const Recipe& recipe, const std::string& path);
// The same for any text; `flag` names the option in the error ("--json").
void write_file_atomically(const std::string& path, const std::string& text,
                           const std::string& flag);

struct Case {
  std::string name;
  RunReport report;
};
void print_compare(const std::vector<Case>& cases, std::ostream& os);

// "0x1234abcd..."
std::string hex(std::uint64_t v);
// v with `digits` decimals: fixed(3.14159, 2) = "3.14".
std::string fixed(double v, int digits);

}  // namespace nodeemu::emu
