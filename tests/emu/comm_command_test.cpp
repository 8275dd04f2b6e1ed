// `nodeemu comm` as a user runs it: every collective priced size by size in nccl-tests' columns,
// the fit's report, and bad input as one line with a non-zero exit.
#include <gtest/gtest.h>

#include <sstream>

#include "tests/emu/cli_runner.hpp"

namespace nodeemu::testing {
namespace {

// The data rows (not '#' comments) of a sweep: size, count, type, time, algbw, busbw.
struct SweepRow {
  double bytes, time_us, algbw, busbw;
};
std::vector<SweepRow> rows_of(const std::string& out) {
  std::vector<SweepRow> rows;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream l(line);
    SweepRow r{};
    std::string count, type;
    l >> r.bytes >> count >> type >> r.time_us >> r.algbw >> r.busbw;
    rows.push_back(r);
  }
  return rows;
}

TEST(CommCommand, EveryCollectiveIsPricedSizeBySizeInNcclTestsColumns) {
  for (const char* c :
       {"all_to_all", "all_gather", "reduce_scatter", "all_reduce", "broadcast", "send_recv"}) {
    const CliResult r = run_cli(std::string("comm ") + c + " --nodes 2 -b 1M -e 64M -f 4");
    ASSERT_EQ(r.code, 0) << c << ": " << r.err;
    EXPECT_NE(r.out.find("16 GPUs, 8 on each of 2 node(s) of dgx_h100"), std::string::npos)
        << r.out;
    const std::vector<SweepRow> rows = rows_of(r.out);
    ASSERT_EQ(rows.size(), 4u) << c << ": 1, 4, 16 and 64 MiB\n" << r.out;
    for (size_t i = 0; i < rows.size(); ++i) {
      EXPECT_GT(rows[i].time_us, 0) << c;
      EXPECT_NEAR(rows[i].algbw, rows[i].bytes / rows[i].time_us / 1e3, 0.01 * rows[i].algbw + 0.01)
          << c;
      if (i > 0) {
        EXPECT_GT(rows[i].time_us, rows[i - 1].time_us) << c << ": larger takes longer";
      }
    }
  }
}

TEST(CommCommand, AllReduceInsideANodeRunsNvlsAndTheBusBandwidthIsNcclTests) {
  const CliResult r = run_cli("comm all_reduce -b 1G -e 1G");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("algorithm nvls"), std::string::npos) << r.out;
  const std::vector<SweepRow> rows = rows_of(r.out);
  ASSERT_EQ(rows.size(), 1u);
  // nccl-tests: busbw = algbw * 2 (n - 1) / n; the fitted NVLS runs ~250 GB/s of algbw at 1 GiB
  // (the public DGX H100 sample: 266).
  EXPECT_NEAR(rows[0].busbw, rows[0].algbw * 2 * 7 / 8, 0.02 * rows[0].busbw);
  EXPECT_GT(rows[0].algbw, 200);
  EXPECT_LT(rows[0].algbw, 300);
}

TEST(CommCommand, FlexDispatchAndCombineReportDeepEpsBandwidths) {
  // DeepEP's benchmark shape (4096 tokens of hidden 7168, top-8 of 256 experts). Across two
  // nodes the RDMA bandwidth is NIC-bound: DeepEP's README measured 43 GB/s on H800s with the
  // same 400 Gb/s NIC per GPU (docs/legacy.md); inside a node NVLink binds.
  for (const char* backend : {"deepep", "hybridep"}) {
    const CliResult across = run_cli(std::string("comm dispatch --nodes 2 --backend ") + backend);
    ASSERT_EQ(across.code, 0) << across.err;
    EXPECT_NE(across.out.find("rdma"), std::string::npos) << across.out;
    // The one data row: time (us), RDMA MB, GB/s.
    std::istringstream row(across.out.substr(across.out.rfind('\n', across.out.size() - 2) + 1));
    double us = 0, mb = 0, gb_s = 0;
    row >> us >> mb >> gb_s;
    EXPECT_NEAR(gb_s, mb / us * 1e3, 0.01 * gb_s) << across.out;  // MB per us is 1000 GB/s
    EXPECT_GT(gb_s, 30) << backend;
    EXPECT_LT(gb_s, 50) << backend;
    const CliResult inside = run_cli(std::string("comm combine --backend ") + backend);
    ASSERT_EQ(inside.code, 0) << inside.err;
    EXPECT_NE(inside.out.find("nvlink"), std::string::npos) << inside.out;
  }
  const CliResult bad = run_cli("comm dispatch --backend nccl");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("--backend"), std::string::npos) << bad.err;
}

TEST(CommCommand, TheFitPrintsTheFiguresAndEachRunsErrors) {
  const CliResult r = run_cli("comm --fit " + std::string(NODEEMU_SOURCE_DIR) +
                              "/configs/calibration/public_fabric/nccl_tests_h100.csv");
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* part : {"fabric fit of dgx_h100", "left out 115: another fabric (internode_efa)",
                           "nvls_efficiency", "simple: {base_latency_us", "leave-one-out |error|"})
    EXPECT_NE(r.out.find(part), std::string::npos) << part << "\n" << r.out;
}

TEST(CommCommand, BadInputIsOneLineNamingTheOption) {
  const CliResult unknown = run_cli("comm all_gatherr");
  EXPECT_EQ(unknown.code, 2);
  EXPECT_NE(unknown.err.find("'all_gatherr' is not a collective"), std::string::npos)
      << unknown.err;
  const CliResult size = run_cli("comm all_reduce -b 1X");
  EXPECT_EQ(size.code, 2);
  EXPECT_NE(size.err.find("--min-bytes"), std::string::npos) << size.err;
  const CliResult gpus = run_cli("comm all_reduce --nodes 2 --gpus 15");
  EXPECT_EQ(gpus.code, 2);
  EXPECT_NE(gpus.err.find("--gpus"), std::string::npos) << gpus.err;
  const CliResult none = run_cli("comm");
  EXPECT_EQ(none.code, 2);
  EXPECT_NE(none.err.find("COLLECTIVE"), std::string::npos) << none.err;
  const CliResult table = run_cli("comm --fit /nonexistent.csv");
  EXPECT_EQ(table.code, 2);
  EXPECT_NE(table.err.find("/nonexistent.csv"), std::string::npos) << table.err;
  for (const CliResult* r : {&unknown, &size, &gpus, &none, &table})
    EXPECT_EQ(std::count(r->err.begin(), r->err.end(), '\n'), 1) << r->err;
}

}  // namespace
}  // namespace nodeemu::testing
