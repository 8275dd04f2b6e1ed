// No input crashes NodeEmu (issue 20): hostile override values on every schema key, random
// override sets, and mutated recipe and topology files, through the command line as a user types
// it (`validate`, and a one-iteration meta `run` for a sample of what validate accepts). Every
// case must end in exit 0 or in exit 2 with an error on stderr; an exception that escapes the
// command line, a signal or a hang fails the test and names the case.
//
// Deterministic: the cases come from a fixed seed, so a failure repeats. Under the sanitizers
// (ten times slower) a twentieth of the cases run.
#include <gtest/gtest.h>

#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "devices/sanitizers.hpp"
#include "emu/cli.hpp"
#include "emu/recipe.hpp"
#include "tests/emu/emu_test_support.hpp"

namespace nodeemu::emu {
namespace {

constexpr int kScale = NODEEMU_UNDER_ASAN || NODEEMU_UNDER_TSAN ? 20 : 1;

// The case being run, for the crash handler and the hang guard: a fixed buffer, so that the
// signal handler can write it without allocating.
char g_case[4096];
std::atomic<std::uint64_t> g_started{0};

void set_case(const std::string& what) {
  const std::size_t n = std::min(what.size(), sizeof(g_case) - 1);
  std::memcpy(g_case, what.data(), n);
  g_case[n] = '\0';
  g_started.fetch_add(1, std::memory_order_release);
}

extern "C" void on_crash(int sig) {
  const char head[] = "\ninput fuzz: crashed on: ";
  (void)!write(2, head, sizeof(head) - 1);
  (void)!write(2, g_case, std::strlen(g_case));
  (void)!write(2, "\n", 1);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

// Crash handlers for the whole test, and a guard thread that ends the process naming the case
// when one case runs for more than a minute (a hang, or a size that validate let through).
class Guard {
 public:
  Guard() {
    for (int s : {SIGFPE, SIGSEGV, SIGBUS, SIGILL, SIGABRT}) std::signal(s, on_crash);
    thread_ = std::thread([this] {
      std::uint64_t seen = g_started.load();
      auto since = std::chrono::steady_clock::now();
      while (!stop_.load()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        const std::uint64_t now = g_started.load(std::memory_order_acquire);
        if (now != seen) {
          seen = now;
          since = std::chrono::steady_clock::now();
        } else if (std::chrono::steady_clock::now() - since > std::chrono::seconds(60 * kScale)) {
          std::fprintf(stderr, "\ninput fuzz: no answer after %d s on: %s\n", 60 * kScale, g_case);
          std::_Exit(1);
        }
      }
    });
  }
  ~Guard() {
    stop_ = true;
    thread_.join();
    for (int s : {SIGFPE, SIGSEGV, SIGBUS, SIGILL, SIGABRT}) std::signal(s, SIG_DFL);
  }

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

struct Outcome {
  int code = 0;
  std::string err;
};

// One command line, in process. Returns the exit code; fails the test (naming the case) on
// anything but 0, or 2 with an error line.
Outcome run_cli(const std::vector<std::string>& args) {
  std::string what;
  for (const auto& a : args) what += (what.empty() ? "" : " ") + a;
  set_case("nodeemu " + what);
  std::ostringstream out, err;
  Outcome o;
  try {
    o.code = main(args, out, err);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "an exception escaped the command line: " << e.what() << "\n  on: nodeemu "
                  << what;
    return {-1, ""};
  }
  o.err = err.str();
  if (o.code == 2)
    EXPECT_FALSE(o.err.empty()) << "exit 2 without a word on stderr\n  on: nodeemu " << what;
  else
    EXPECT_EQ(o.code, 0) << o.err << "\n  on: nodeemu " << what;
  return o;
}

const std::string& tiny_path() {
  static const std::string p = testing::recipe_path("tiny_moe");
  return p;
}

// A meta run needs the forced routing draw (or validate refuses it); one iteration.
Outcome meta_run(std::vector<std::string> overrides) {
  std::vector<std::string> args = {
      "run",        tiny_path(),    "--mode",
      "meta",       "--iterations", "1",
      "--baseline", "off",          "model.moe_router_force_load_balancing=true"};
  args.insert(args.end(), overrides.begin(), overrides.end());
  return run_cli(args);
}

// Values that have broken parsers: empty and null, the IEEE specials, the integer limits,
// signs, the wrong YAML kind, non-UTF-8 bytes, YAML syntax on its own.
const std::vector<std::string>& hostile_values() {
  static const std::vector<std::string> v = {"",
                                             "~",
                                             "null",
                                             "nan",
                                             "-nan",
                                             ".nan",
                                             "inf",
                                             "-inf",
                                             ".inf",
                                             "1e308",
                                             "-1e308",
                                             "1e-320",
                                             "-1",
                                             "0",
                                             "1",
                                             "2",
                                             "3",
                                             "0.5",
                                             "-0.0",
                                             "-2",
                                             "65",
                                             "4097",
                                             "2147483648",
                                             "99999999999999999999",
                                             "-9223372036854775808",
                                             "[]",
                                             "[1]",
                                             "[0, 0, 1]",
                                             "[a, b]",
                                             "{}",
                                             "{a: 1}",
                                             "true",
                                             "false",
                                             "yes",
                                             "abc",
                                             "\xff\xfe\xfd",
                                             "'",
                                             "\"",
                                             ":",
                                             "- x",
                                             "!!binary x",
                                             "&a x",
                                             "*a",
                                             "1:2",
                                             "0x10",
                                             "1_000"};
  return v;
}

// Small values: a meta run of them stays small (a huge size is validate's or the run's to
// refuse, not this test's to wait for).
bool small_enough_to_run(const std::string& v) {
  try {
    std::size_t used = 0;
    const double x = std::stod(v, &used);
    return !(x > 64);
  } catch (const std::exception&) {
    return true;
  }
}

TEST(InputFuzz, EveryKeyWithEveryHostileValue) {
  Guard guard;
  int runs = 0, accepted = 0, index = 0;
  for (const KeySpec& k : recipe_schema()) {
    for (const std::string& v : hostile_values()) {
      if (index++ % kScale != 0) continue;  // under the sanitizers, a sample of the pairs
      const std::string assignment = k.key + "=" + v;
      const Outcome o = run_cli({"validate", tiny_path(), "--mode", "meta",
                                 "model.moe_router_force_load_balancing=true", assignment});
      if (o.code != 0) continue;
      ++accepted;
      // Every accepted value of a sample runs: enough to reach each kind of key.
      if (small_enough_to_run(v) && (accepted - 1) % 7 == 0) {
        meta_run({assignment});
        ++runs;
      }
    }
    if (HasFailure()) return;  // one key's story is enough to read
  }
  EXPECT_GT(accepted, 0);
  EXPECT_GT(runs, 0);
}

TEST(InputFuzz, RandomOverrideSets) {
  Guard guard;
  std::mt19937_64 rng(20261127);
  const auto& schema = recipe_schema();
  const auto& hostile = hostile_values();
  const int sets = 10000 / kScale;
  int runs = 0, accepted_small = 0;
  for (int i = 0; i < sets && !HasFailure(); ++i) {
    std::vector<std::string> overrides;
    const int n = 1 + int(rng() % 3);
    bool small = true;
    for (int j = 0; j < n; ++j) {
      const KeySpec& k = schema[rng() % schema.size()];
      // Half the time a value the key could take (its default or one of its choices), so that
      // sets get past the first refusal and combine.
      std::string v;
      if (rng() % 2 == 0 && !k.choices.empty())
        v = k.choices[rng() % k.choices.size()];
      else if (rng() % 2 == 0 && !k.default_yaml.empty())
        v = k.default_yaml;
      else
        v = hostile[rng() % hostile.size()];
      small = small && small_enough_to_run(v);
      overrides.push_back(k.key + "=" + v);
    }
    std::vector<std::string> args = {"validate", tiny_path(), "--mode", "meta",
                                     "model.moe_router_force_load_balancing=true"};
    args.insert(args.end(), overrides.begin(), overrides.end());
    // The first set validate accepts runs, then every 25th.
    if (run_cli(args).code == 0 && small && accepted_small++ % 25 == 0) {
      meta_run(overrides);
      ++runs;
    }
  }
  EXPECT_GT(runs, 0);
}

// A YAML file mutated as a hand edit goes wrong: a line dropped, doubled or cut short, an indent
// lost or added, a value replaced by a hostile one, stray bytes, the file truncated.
std::string mutate(const std::string& text, std::mt19937_64& rng) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  const auto& hostile = hostile_values();
  const int edits = 1 + int(rng() % 3);
  for (int e = 0; e < edits && !lines.empty(); ++e) {
    const std::size_t i = rng() % lines.size();
    std::string& l = lines[i];
    switch (rng() % 8) {
      case 0:
        lines.erase(lines.begin() + long(i));
        break;
      case 1:
        lines.insert(lines.begin() + long(i), l);
        break;
      case 2:
        l = l.substr(0, rng() % (l.size() + 1));
        break;
      case 3:
        if (l.rfind("  ", 0) == 0) l = l.substr(2);
        break;
      case 4:
        l = "  " + l;
        break;
      case 5:
        if (auto c = l.find(':'); c != std::string::npos)
          l = l.substr(0, c + 1) + " " + hostile[rng() % hostile.size()];
        break;
      case 6:
        l.insert(rng() % (l.size() + 1), 1, char(rng() % 256));
        break;
      default: {
        std::string joined;
        for (const auto& x : lines) joined += x + "\n";
        return joined.substr(0, rng() % (joined.size() + 1));
      }
    }
  }
  std::string joined;
  for (const auto& x : lines) joined += x + "\n";
  return joined;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

TEST(InputFuzz, MutatedRecipeAndTopologyFiles) {
  Guard guard;
  std::mt19937_64 rng(7);
  const std::string recipe = slurp(tiny_path());
  const std::string topology =
      slurp(std::string(NODEEMU_SOURCE_DIR) + "/configs/topologies/dgx_h100.yaml");
  const std::string dir = ::testing::TempDir() + "nodeemu_fuzz_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  const std::string recipe_file = dir + "/recipe.yaml", topology_file = dir + "/topology.yaml";
  const int files = 1000 / kScale;
  for (int i = 0; i < files && !HasFailure(); ++i) {
    if (i % 2 == 0) {
      std::ofstream(recipe_file) << mutate(recipe, rng);
      run_cli(
          {"validate", recipe_file, "--mode", "meta", "model.moe_router_force_load_balancing=true",
           "topology=" + std::string(NODEEMU_SOURCE_DIR) + "/configs/topologies/dgx_h100.yaml"});
    } else {
      std::ofstream(topology_file) << mutate(topology, rng);
      run_cli({"validate", tiny_path(), "--mode", "meta",
               "model.moe_router_force_load_balancing=true", "topology=" + topology_file});
      run_cli({"info", "--topology", topology_file});
    }
  }
  std::filesystem::remove_all(dir);
}

// Issue 20's report: an empty value (or `~`) for a size died with SIGFPE in a meta run.
TEST(InputFuzz, AnEmptyMicroBatchSizeIsAnErrorNotACrash) {
  for (const char* v : {"", "~"}) {
    const Outcome o = meta_run({std::string("train.micro_batch_size=") + v});
    EXPECT_EQ(o.code, 2);
    EXPECT_NE(o.err.find("train.micro_batch_size"), std::string::npos) << o.err;
  }
}

}  // namespace
}  // namespace nodeemu::emu
