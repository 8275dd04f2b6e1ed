// End-to-end: the nodeemu binary as a user runs it.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "devices/blas_kernel.hpp"
#include "tests/emu/cli_runner.hpp"

namespace {

using Result = nodeemu::testing::CliResult;
using nodeemu::testing::read_file;

Result run(const std::string& args) {
  return nodeemu::testing::run_cli(args);
}

std::string write_file(const std::string& name, const std::string& text) {
  return nodeemu::testing::write_temp_file(name, text);
}

std::string shipped(const std::string& name) {
  return std::string(NODEEMU_SOURCE_DIR) + "/configs/topologies/" + name;
}

int lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

TEST(Cli, InfoShowsTheNodeTheMappingAndTheGemmKernel) {
  Result r = run("info");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("dgx_h100"), std::string::npos);
  EXPECT_NE(r.out.find("H100-SXM5-80GB"), std::string::npos);
  EXPECT_NE(r.out.find("OpenBLAS kernel"), std::string::npos);
  EXPECT_NE(r.out.find("real-NUMA"), std::string::npos);
  EXPECT_NE(r.out.find("landed on node"), std::string::npos);
  // One row per GPU in the mapping table.
  for (int g = 0; g < 8; ++g)
    EXPECT_NE(r.out.find("\n  " + std::to_string(g) + "    "), std::string::npos);
}

TEST(Cli, InfoReadsEveryShippedTopology) {
  for (const char* t : {"dgx_h100.yaml", "dgx_h200.yaml", "hgx_a100.yaml", "dgx_b200.yaml"}) {
    Result r = run("info --topology " + shipped(t));
    EXPECT_EQ(r.code, 0) << t << ": " << r.err;
  }
}

TEST(Cli, InfoOnASyntheticHostFoldsOntoThisMachine) {
  Result r = run("info --synthetic-host 'package:2 numa:1 core:4 pu:1'");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("synthetic"), std::string::npos);
}

TEST(Cli, InfoSaysWhereEachRanksHostThreadAndPinnedMemoryLive) {
  Result bound = run("info --synthetic-host 'package:2 numa:1 core:4 pu:1' --bindpcie on");
  ASSERT_EQ(bound.code, 0) << bound.err;
  EXPECT_NE(bound.out.find("Host side of each rank (--bindpcie on)"), std::string::npos);
  EXPECT_EQ(bound.out.find("(far)"), std::string::npos) << bound.out;
  Result unbound = run("info");
  ASSERT_EQ(unbound.code, 0) << unbound.err;
  EXPECT_NE(unbound.out.find("Host side of each rank (unbound)"), std::string::npos);
  EXPECT_NE(unbound.out.find("1 (far)"), std::string::npos) << unbound.out;  // GPU 4: socket 1
  Result bad = run("info --bindpcie maybe");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("--bindpcie: maybe not in {on,off}"), std::string::npos) << bad.err;
}

TEST(Cli, MissingTopologyFileIsOneLineNamingTheFile) {
  Result r = run("info --topology /nonexistent/topo.yaml");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("/nonexistent/topo.yaml"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty());
}

TEST(Cli, UnknownKeyInTopologyIsNamedWithASuggestion) {
  std::ifstream in(shipped("dgx_h100.yaml"));
  std::string text((std::istreambuf_iterator<char>(in)), {});
  auto pos = text.find("hbm_tb_s");
  ASSERT_NE(pos, std::string::npos);
  text.replace(pos, 8, "hbm_tbs");
  Result r = run("info --topology " + write_file("typo.yaml", text));
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("gpu.hbm_tbs"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("hbm_tb_s"), std::string::npos) << r.err;
}

TEST(Cli, BadValueNamesTheKey) {
  std::ifstream in(shipped("dgx_h100.yaml"));
  std::string text((std::istreambuf_iterator<char>(in)), {});
  auto pos = text.find("sms: 132");
  text.replace(pos, 8, "sms: many");
  Result r = run("info --topology " + write_file("badval.yaml", text));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("gpu.sms"), std::string::npos) << r.err;
}

// Every subcommand explains itself: its options and an example, on stdout, exit 0, before any
// argument is checked (a help request with a missing recipe still helps).
TEST(Cli, HelpWorksForEverySubcommand) {
  for (const char* c :
       {"info", "demo", "validate", "run", "compare", "layer", "keys", "cost", "calibrate"}) {
    for (const char* flag : {"--help", "-h"}) {
      Result r = run(std::string(c) + " " + flag);
      EXPECT_EQ(r.code, 0) << c << " " << flag << ": " << r.err;
      EXPECT_EQ(r.out.rfind(std::string("usage: nodeemu ") + c + " ", 0), 0u) << r.out;
      EXPECT_NE(r.out.find("example:\n  nodeemu " + std::string(c)), std::string::npos) << r.out;
    }
  }
  // The options each command declares, listed by the parser that reads them.
  for (const auto& [c, option] :
       std::vector<std::pair<std::string, std::string>>{{"run", "--summary"},
                                                        {"run", "--iterations"},
                                                        {"compare", "--mode"},
                                                        {"demo", "--max-connections"},
                                                        {"info", "--bindpcie"},
                                                        {"cost", "--explain"},
                                                        {"calibrate", "--errors"},
                                                        {"layer", "--json"}})
    EXPECT_NE(run(c + " --help").out.find("  " + option), std::string::npos) << c << " " << option;
  Result all = run("help");
  EXPECT_EQ(all.code, 0);
  EXPECT_NE(all.out.find("nodeemu <command> --help"), std::string::npos);
}

const std::string kTiny = std::string(NODEEMU_SOURCE_DIR) + "/configs/recipes/tiny_moe.yaml";

// A user's OPENBLAS_CORETYPE wins over NodeEmu's kernel; one whose results depend on a GEMM's
// size and layout (OpenBLAS's AVX-512 kernels) is said where the summary names the kernel, and
// without it the summary names NodeEmu's own.
TEST(Cli, AUsersGemmKernelThatBreaksTheNumericsPromisesIsSaid) {
  const nodeemu::blas::CpuFeatures f = nodeemu::blas::CpuFeatures::detect();
  if (!(f.os_saves_avx512 && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.avx512cd))
    GTEST_SKIP() << "needs a CPU that runs OpenBLAS's SkylakeX kernels";
  Result plain = run("run " + kTiny + " --iterations 1");
  ASSERT_EQ(plain.code, 0) << plain.err;
  EXPECT_NE(plain.out.find("GEMMs openblas-sgemm/Haswell\n"), std::string::npos) << plain.out;
  ::setenv("OPENBLAS_CORETYPE", "SkylakeX", 1);
  Result forced = run("run " + kTiny + " --iterations 1");
  ::unsetenv("OPENBLAS_CORETYPE");
  ASSERT_EQ(forced.code, 0) << forced.err;
  EXPECT_NE(forced.out.find("GEMMs openblas-sgemm/SkylakeX (not Haswell: its results depend on"),
            std::string::npos)
      << forced.out;
}

TEST(Cli, OptionsAreCheckedByTheParserInOneLine) {
  Result r = run("run " + kTiny + " --iterations 0");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--iterations"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  r = run("validate " + kTiny + " --case base");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--case: only 'compare' takes cases"), std::string::npos) << r.err;
  r = run("validate");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("recipe is required"), std::string::npos) << r.err;
  // The command's own options may come anywhere, the recipe too.
  r = run("validate --mode functional " + kTiny + " model.num_layers=2");
  EXPECT_EQ(r.code, 0) << r.err;
}

// Every recipe key from the schema itself, so a user without the source can find one.
TEST(Cli, KeysListsTheSchemaBySection) {
  Result all = run("keys");
  ASSERT_EQ(all.code, 0) << all.err;
  EXPECT_NE(all.out.find("model.num_layers "), std::string::npos);
  EXPECT_NE(all.out.find("emulator.collective_timeout_s "), std::string::npos);
  Result one = run("keys comm_overlap");
  ASSERT_EQ(one.code, 0) << one.err;
  EXPECT_NE(one.out.find("comm_overlap.overlap_moe_expert_parallel_comm "), std::string::npos);
  EXPECT_EQ(one.out.find("model."), std::string::npos) << one.out;
  Result bad = run("keys modle");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("modle: no such section; did you mean 'model'?"), std::string::npos)
      << bad.err;
  // One key (issue 54, item 6), and a mistyped one.
  Result key = run("keys model.moe_router_topk");
  ASSERT_EQ(key.code, 0) << key.err;
  EXPECT_EQ(key.out.rfind("model.moe_router_topk ", 0), 0u) << key.out;
  EXPECT_EQ(std::count(key.out.begin(), key.out.end(), '\n'), 1) << key.out;
  Result typo = run("keys model.moe_router_top_k");
  EXPECT_EQ(typo.code, 2);
  EXPECT_NE(typo.err.find("did you mean 'model.moe_router_topk'?"), std::string::npos) << typo.err;
}

TEST(Cli, UnknownOptionAndCommandAreErrors) {
  Result r = run("info --topologyy x");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--topologyy"), std::string::npos) << r.err;
  r = run("frobnicate");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("frobnicate"), std::string::npos);
  r = run("demo --max-connections 0");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("cuda_device_max_connections"), std::string::npos) << r.err;
}

TEST(Cli, DemoPrintsItsVirtualTimelineAndWritesATrace) {
  std::string trace = ::testing::TempDir() + std::to_string(getpid()) + "_demo_trace.json";
  Result a = run("demo --trace " + trace);
  ASSERT_EQ(a.code, 0) << a.err;
  EXPECT_NE(a.out.find("f.dispatch"), std::string::npos);
  EXPECT_NE(a.out.find("timeline hash"), std::string::npos);
  std::ifstream f(trace);
  std::string json((std::istreambuf_iterator<char>(f)), {});
  EXPECT_NE(json.find("\"traceEvents\""), std::string::npos);
  EXPECT_NE(json.find("copy engine H2D"), std::string::npos);
  EXPECT_NE(json.find("\"ph\":\"s\""), std::string::npos);  // flow arrows for event waits
  // Deterministic: the same output twice.
  Result b = run("demo --trace " + trace);
  EXPECT_EQ(a.out, b.out);
}

TEST(Cli, TraceToAnUnwritablePathFailsCleanly) {
  Result r = run("demo --trace /nonexistent/dir/t.json");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("/nonexistent/dir/t.json"), std::string::npos) << r.err;
}

}  // namespace

// --- recipes: validate, run, compare ---
namespace {

TEST(Cli, ValidateAcceptsTheTinyRecipe) {
  Result r = run("validate " + kTiny + " --overlap-moe-expert-parallel-comm");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("ok: "), std::string::npos);
  EXPECT_NE(r.out.find("schedule combined-1f1b-a2a-overlap"), std::string::npos) << r.out;
}

TEST(Cli, ValidateRefusesABadRecipeWithOneLinePerRule) {
  Result r = run("validate " + kTiny +
                 " --overlap-moe-expert-parallel-comm model.bf16=false "
                 "model.moe_shared_expert_overlap=true");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err,
            "error: model.bf16: set bf16 (or fp16) (required by "
            "comm_overlap.overlap_moe_expert_parallel_comm)\n"
            "error: model.moe_shared_expert_overlap: must be false (required by "
            "comm_overlap.overlap_moe_expert_parallel_comm)\n");
}

TEST(Cli, RunRefusesABadRecipeAndStartsNothing) {
  const std::string summary =
      ::testing::TempDir() + std::to_string(getpid()) + "_refused_summary.json";
  std::remove(summary.c_str());
  Result r = run("run " + kTiny + " model.num_moe_experts=6 --summary " + summary);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("error: model.num_moe_experts: 6 experts do not divide over EP = 4"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("nodeemu run: refused; nothing was started"), std::string::npos);
  EXPECT_EQ(r.err.find("iter "), std::string::npos);  // no progress: nothing ran
  EXPECT_FALSE(std::ifstream(summary).good());
}

// issue 54, item 6: the version, and the nearest command for a mistyped one.
TEST(Cli, VersionAndAMistypedCommand) {
  Result v = run("--version");
  EXPECT_EQ(v.code, 0);
  EXPECT_EQ(v.out.rfind("nodeemu 0.", 0), 0u) << v.out;
  Result typo = run("valdate " + kTiny);
  EXPECT_EQ(typo.code, 2);
  EXPECT_NE(typo.err.find("unknown command 'valdate'; did you mean 'validate'?"), std::string::npos)
      << typo.err;
  Result far = run("frobnicate");
  EXPECT_EQ(far.code, 2);
  EXPECT_EQ(far.err.find("did you mean"), std::string::npos) << far.err;
}

TEST(Cli, UnknownRecipeKeyIsOneLineWithASuggestion) {
  Result r = run("run " + kTiny + " model.moe_router_top_k=4");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err,
            "error: override: model.moe_router_top_k: unknown key; did you mean "
            "'model.moe_router_topk'?\nnodeemu run: refused; nothing was started\n");
}

TEST(Cli, RunWritesItsSummaryTraceAndTable) {
  const std::string summary =
      ::testing::TempDir() + std::to_string(getpid()) + "_tiny_summary.json";
  const std::string trace = ::testing::TempDir() + std::to_string(getpid()) + "_tiny_trace.json";
  Result r = run("run " + kTiny + " --iterations 2 --overlap-moe-expert-parallel-comm --summary " +
                 summary + " --trace " + trace);
  ASSERT_EQ(r.code, 0) << r.err;
  // Progress on stderr, the table on stdout.
  EXPECT_NE(r.err.find("iter 2/2"), std::string::npos) << r.err;
  for (const char* s :
       {"steady mean step", "1 warm-up iteration excluded", "exposed", "compute utilisation",
        "peak mem GiB", "numerics hash 0x", "GFLOP/s over the wall time", "GiB per emulated GPU"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
  // The summary is JSON a script can read: read it back with a JSON library.
  const auto json = nlohmann::json::parse(read_file(summary));
  EXPECT_EQ(json["recipe"], "tiny_moe");
  EXPECT_EQ(json["mode"], "functional");
  EXPECT_EQ(json["warmup_iterations"], 1);
  ASSERT_EQ(json["iterations"].size(), 2u);
  EXPECT_EQ(json["iterations"][0]["iter"], 1);
  EXPECT_TRUE(json["iterations"][0]["loss"].is_number());
  EXPECT_GT(json["step_time_s"].get<double>(), 0);
  ASSERT_EQ(json["devices"].size(), 4u);
  for (const auto& d : json["devices"])
    for (const char* key : {"peak_mem_bytes", "compute_busy_s", "comm_busy_s", "offload_bytes"})
      EXPECT_TRUE(d[key].is_number()) << key;
  for (const char* key : {"gemm_kernel", "exposed_comm_s", "total_comm_s", "exposed_offload_s",
                          "total_offload_s", "timeline_hash", "wall_time_s"})
    EXPECT_TRUE(json.contains(key)) << key;
  EXPECT_EQ(json["numerics_hash"].get<std::string>().rfind("0x", 0), 0u);
  EXPECT_GT(json["functional_kernel_flops"].get<double>(), 0);
  EXPECT_GT(json["peak_host_bytes"].get<std::uint64_t>(), 0u);
  EXPECT_EQ(json["config"]["model.num_layers"], "4");
  const std::string t = read_file(trace);
  EXPECT_NE(t.find("\"traceEvents\""), std::string::npos);
  EXPECT_NE(t.find("dispatch"), std::string::npos);
}

// A full-size run's trace of every GPU does not fit in memory: --trace-gpus keeps a few.
TEST(Cli, TraceGpusKeepsTheTraceToThoseGpus) {
  const std::string trace = ::testing::TempDir() + std::to_string(getpid()) + "_gpus_trace.json";
  Result r = run("run " + kTiny + " --iterations 1 --trace " + trace + " --trace-gpus 1,3");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("(GPUs 1,3)"), std::string::npos) << r.out;
  std::set<int> pids;
  const auto json = nlohmann::json::parse(read_file(trace));
  for (const auto& e : json["traceEvents"])
    if (e["ph"] == "X") pids.insert(e["pid"].get<int>());
  EXPECT_EQ(pids, (std::set<int>{1, 3}));
  std::remove(trace.c_str());
  for (const auto& [list, why] :
       {std::pair{"4", "GPU 4 does not exist; the recipe lays out 4 GPUs (0-3)"},
        std::pair{"0-x", "not a list of GPU numbers and ranges; write e.g. 0-7,64"},
        std::pair{"3-1", "not a list of GPU numbers and ranges"},
        std::pair{"0-2000000000", "not a list of GPU numbers and ranges"},
        std::pair{"''", "'' is not a list of GPU numbers and ranges"}}) {
    Result bad = run("run " + kTiny + " --iterations 1 --trace " + trace + " --trace-gpus " + list);
    EXPECT_EQ(bad.code, 2) << list;
    EXPECT_NE(bad.err.find(why), std::string::npos) << bad.err;
    EXPECT_EQ(std::count(bad.err.begin(), bad.err.end(), '\n'), 1) << bad.err;
    EXPECT_FALSE(std::ifstream(trace).good()) << "nothing half-written";
  }
  Result alone = run("run " + kTiny + " --iterations 1 --trace-gpus 1");
  EXPECT_EQ(alone.code, 2);
  EXPECT_NE(alone.err.find("--trace-gpus requires --trace"), std::string::npos) << alone.err;
}

TEST(Cli, CompareRunsTheCasesSideBySide) {
  Result r = run("compare " + kTiny +
                 " --iterations 2 --case no_overlap --case overlap "
                 "--overlap-moe-expert-parallel-comm --delay-wgrad-compute");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("case       | "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("steady mean ms | speedup | TFLOP/s/GPU | "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("MFU | comm hidden | exposed comm ms | peak mem GiB"), std::string::npos);
  EXPECT_NE(r.out.find("no_overlap |                sequential |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("overlap    | combined-1f1b-a2a-overlap |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("1.000x"), std::string::npos);
  // What the ratio means, and no column that is empty in every case (neither offloads).
  EXPECT_NE(r.out.find("speedup = the first case's steady step / this case's"), std::string::npos);
  EXPECT_EQ(r.out.find("offload MiB"), std::string::npos) << r.out;
  // And in words, where the difference went.
  EXPECT_NE(r.out.find("overlap against no_overlap: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("exposed communication "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("the GPU waiting on its host "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("the GPU idle otherwise (waiting on a dependency)"), std::string::npos);
}

// Meta-mode cases run several at once by default: the same table as one after another, each
// progress line named by its case; --jobs must be at least 1.
TEST(Cli, CompareRunsMetaCasesAtOnceWithTheSameTable) {
  const std::string cases =
      " --mode meta model.moe_router_force_load_balancing=true --iterations 2 "
      "--case base --case overlap --overlap-moe-expert-parallel-comm "
      "--delay-wgrad-compute";
  Result alone = run("compare " + kTiny + cases + " --jobs 1");
  Result together = run("compare " + kTiny + cases + " --jobs 2");
  ASSERT_EQ(alone.code, 0) << alone.err;
  ASSERT_EQ(together.code, 0) << together.err;
  EXPECT_EQ(alone.out, together.out);
  EXPECT_EQ(alone.err.find("at once"), std::string::npos) << alone.err;
  EXPECT_NE(together.err.find("nodeemu compare: 2 cases, 2 at once"), std::string::npos)
      << together.err;
  EXPECT_NE(together.err.find("case overlap: iter 2/2"), std::string::npos) << together.err;
  Result none = run("compare " + kTiny + cases + " --jobs 0");
  EXPECT_EQ(none.code, 2);
  EXPECT_NE(none.err.find("--jobs: Value 0 not in range 1 to 1024"), std::string::npos) << none.err;
}

}  // namespace
