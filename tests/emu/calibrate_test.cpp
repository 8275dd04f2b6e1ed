// `nodeemu calibrate` on a measured folder: the profile it writes, how it reads the grouped
// kernel's tiling from device.json, and the per-row leave-one-out file.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "tests/emu/cli_runner.hpp"

namespace {

namespace fs = std::filesystem;
using nodeemu::testing::read_file;
using nodeemu::testing::run_cli;

// The shipped H100 measurement as tools/measure_gpu.py would have left it, with `device_extra`
// added to its device.json.
std::string measured_folder(const std::string& name, const std::string& device_extra) {
  const fs::path dir = fs::path(::testing::TempDir()) / (std::to_string(getpid()) + "_" + name);
  // What an earlier run with the same pid left: calibrate refuses an --out that exists.
  for (const char* left : {"", "_profile", "_loo.csv"}) fs::remove_all(dir.string() + left);
  fs::create_directories(dir);
  const fs::path h100 = fs::path(NODEEMU_SOURCE_DIR) / "configs/gpus/h100_sxm5";
  for (const auto& e : fs::directory_iterator(h100))
    if (e.path().extension() == ".csv") fs::copy_file(e.path(), dir / e.path().filename());
  std::ofstream(dir / "device.json")
      << "{\"gpu\": \"NVIDIA H100 80GB HBM3\", \"sms\": 132" << device_extra << "}";
  return dir.string();
}

// The grouped table's line of the leave-one-out report.
std::string grouped_line(const std::string& out) {
  const auto at = out.find("grouped_gemm_bf16.csv");
  return at == std::string::npos ? "" : out.substr(at, out.find('\n', at) - at);
}

TEST(Calibrate, TorchGroupedMmOnHopperGetsItsTilingAndTheShippedErrors) {
  const std::string dir = measured_folder(
      "hopper", ", \"grouped_kernel\": \"torch._grouped_mm\", \"compute_capability\": \"9.0\"");
  const std::string out = dir + "_profile", errors = dir + "_loo.csv";
  const auto r = run_cli("calibrate " + dir + " --out " + out + " --errors " + errors);
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string yaml = read_file(out + "/profile.yaml");
  EXPECT_NE(yaml.find("grouped_gemm_tiling:\n  tile_rows: 128\n  tile_cols: 256\n"),
            std::string::npos)
      << yaml;
  // The same tables and tiling as the shipped profile: the same leave-one-out figures.
  const auto shipped =
      run_cli("calibrate " + std::string(NODEEMU_SOURCE_DIR) + "/configs/gpus/h100_sxm5");
  ASSERT_EQ(shipped.code, 0) << shipped.err;
  EXPECT_EQ(grouped_line(r.out), grouped_line(shipped.out));
  // --errors: one line per measured row and column, the error signed (+: predicted too slow).
  std::istringstream csv(read_file(errors));
  std::string line;
  std::getline(csv, line);
  EXPECT_EQ(line, "table,column,row,measured_seconds,predicted_seconds,error");
  int lines = 0, worst_row = 0;
  double worst = 0;
  while (std::getline(csv, line)) {
    ++lines;
    std::vector<std::string> f;
    std::stringstream ls(line);
    for (std::string c; std::getline(ls, c, ',');) f.push_back(c);
    ASSERT_EQ(f.size(), 6u) << line;
    const double measured = std::stod(f[3]), predicted = std::stod(f[4]), error = std::stod(f[5]);
    EXPECT_NEAR(error, predicted / measured - 1, 1e-3) << line;
    if (f[0] == "grouped_gemm_bf16.csv" && std::abs(error) > worst)
      worst = std::abs(error), worst_row = std::stoi(f[2]);
  }
  // gemm 1860, grouped 377, attention 45 forward and 45 backward, memory 46, PCIe 31, fp32 GEMM 2.
  EXPECT_EQ(lines, 1860 + 377 + 45 + 45 + 46 + 31 + 2);
  // The report's "worst at" names the row of the largest error.
  EXPECT_NE(grouped_line(r.out).find("row " + std::to_string(worst_row) + " ("), std::string::npos)
      << grouped_line(r.out);
}

TEST(Calibrate, ALoopOfGemmsHasNoTilingAndSaysSo) {
  const std::string dir = measured_folder("loop", ", \"grouped_kernel\": \"loop_mm\"");
  const auto r = run_cli("calibrate " + dir + " --out " + dir + "_profile");
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string yaml = read_file(dir + "_profile/profile.yaml");
  EXPECT_EQ(yaml.find("\ngrouped_gemm_tiling:"), std::string::npos);
  EXPECT_NE(yaml.find("its time per unit of work is interpolated"), std::string::npos) << yaml;
}

TEST(Calibrate, AGroupedKernelWithoutItsComputeCapabilityIsOneLine) {
  const std::string dir = measured_folder("no_cc", ", \"grouped_kernel\": \"torch._grouped_mm\"");
  const auto r = run_cli("calibrate " + dir + " --out " + dir + "_profile");
  EXPECT_NE(r.code, 0);
  EXPECT_EQ(r.err, "nodeemu: error: " + dir +
                       "/device.json: compute_capability: needs the GPU's compute capability "
                       "as \"major.minor\" beside grouped_kernel; tools/measure_gpu.py writes "
                       "it\n");
  EXPECT_FALSE(fs::exists(dir + "_profile"));
}

TEST(Calibrate, ADeviceJsonWithoutSmsIsOneLineAndLeavesNothing) {
  const std::string dir = measured_folder("no_sms", "");
  std::ofstream(dir + "/device.json") << "{\"gpu\": \"NVIDIA H100 80GB HBM3\", \"sms\": 0}";
  const auto r =
      run_cli("calibrate " + dir + " --out " + dir + "_profile --errors " + dir + "_loo.csv");
  EXPECT_NE(r.code, 0);
  EXPECT_EQ(r.err, "nodeemu: error: " + dir +
                       "/device.json: gpu: needs 'gpu' (a string) and 'sms' (an integer >= 1); "
                       "tools/measure_gpu.py writes them\n");
  EXPECT_FALSE(fs::exists(dir + "_profile"));
  EXPECT_FALSE(fs::exists(dir + "_loo.csv"));
}

}  // namespace
