#include "devices/process_memory.hpp"

#include <fstream>
#include <string>

namespace nodeemu {

std::optional<std::size_t> peak_resident_bytes() {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;  // in kB
  return std::nullopt;
}

bool reset_peak_resident() {
  std::ofstream f("/proc/self/clear_refs");
  return bool(f << "5");
}

}  // namespace nodeemu
