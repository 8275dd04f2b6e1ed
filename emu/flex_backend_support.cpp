#include "emu/flex_backend_support.hpp"

namespace nodeemu::emu {

std::string flex_backend_unsupported(const std::string& backend, const GpuSpec& gpu) {
  const int major = gpu.cc_major;
  const std::string cc = std::to_string(gpu.cc_major) + "." + std::to_string(gpu.cc_minor);
  if (backend == "deepep") {
    // Bridge matches the CUDA device name's prefix (startswith since f565adb8), so a GB200
    // does not pass as a B200. CUDA names the part "NVIDIA <model>": a topology's "B200-SXM-..."
    // is "NVIDIA B200".
    const std::string cuda = "NVIDIA " + gpu.name.substr(0, gpu.name.find('-'));
    const bool blackwell_name =
        cuda.rfind("NVIDIA B200", 0) == 0 || cuda.rfind("NVIDIA B300", 0) == 0;
    if (major != 8 && major != 9 && !blackwell_name)
      return "DeepEP needs compute capability 8.x or 9.x (or an NVIDIA B200/B300), and " +
             gpu.name + " is " + cc;
  } else if (major != 8 && major != 9 && major != 10) {
    return "HybridEP needs compute capability 8.x, 9.x or 10.x, and " + gpu.name + " is " + cc;
  }
  return "";
}

}  // namespace nodeemu::emu
