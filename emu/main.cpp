#include <iostream>
#include <string>
#include <vector>

#include "emu/cli.hpp"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  try {
    return nodeemu::emu::main(args, std::cout, std::cerr);
  } catch (const std::exception& e) {
    std::cerr << "nodeemu: error: " << e.what() << "\n";
    return 1;
  }
}
