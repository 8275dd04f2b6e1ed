// Shared by the end-to-end tests: the nodeemu binary run as a user runs it.
#pragma once
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

#ifndef NODEEMU_BINARY_DIR
#define NODEEMU_BINARY_DIR "build"
#endif
#ifndef NODEEMU_SOURCE_DIR
#define NODEEMU_SOURCE_DIR "."
#endif

namespace nodeemu::testing {

struct CliResult {
  int code;
  std::string out, err;
};

inline CliResult run_cli(const std::string& args) {
  // ctest runs tests in parallel processes: each test gets its own stderr file.
  const std::string err_file = ::testing::TempDir() + "nodeemu_cli_err_" +
                               ::testing::UnitTest::GetInstance()->current_test_info()->name() +
                               ".txt";
  std::string cmd = std::string(NODEEMU_BINARY_DIR) + "/bin/nodeemu " + args + " 2>" + err_file;
  CliResult r;
  FILE* p = popen(cmd.c_str(), "r");
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), p)) r.out.append(buf.data(), n);
  int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream f(err_file);
  r.err.assign(std::istreambuf_iterator<char>(f), {});
  return r;
}

// A file in the test's temporary folder, named per process.
inline std::string write_temp_file(const std::string& name, const std::string& text) {
  std::string path = ::testing::TempDir() + std::to_string(getpid()) + "_" + name;
  std::ofstream(path) << text;
  return path;
}

inline std::string read_file(const std::string& path) {
  std::ifstream f(path);
  return {std::istreambuf_iterator<char>(f), {}};
}

}  // namespace nodeemu::testing
