// The `nodeemu` command line. Each subcommand returns the process exit code: 0 on success,
// 2 for bad input (one line on stderr naming the file, key or flag), 1 for a failed run.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

namespace nodeemu::emu {

int main(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

// Subcommands, with their arguments after the subcommand name.
int info_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);
int demo_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);
int validate_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);
int run_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);
int compare_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);
int layer_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);
int cost_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);
int calibrate_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

// The topology shipped inside the binary (configs/topologies/dgx_h100.yaml at build time), so
// that `nodeemu` works from any directory.
const std::string& embedded_default_topology();

// Flag parsing shared by the subcommands: "--key value" or "--key=value".
class Flags {
 public:
  Flags(std::string command, const std::vector<std::string>& args,
        const std::vector<std::string>& known);
  bool has(const std::string& key) const;
  std::string get(const std::string& key, const std::string& fallback) const;
  int get_int(const std::string& key, int fallback) const;

 private:
  std::string command_;
  std::vector<std::pair<std::string, std::string>> values_;
};

}  // namespace nodeemu::emu
