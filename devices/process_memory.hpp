// The host memory this process holds, as Linux counts it: what the run summary reports per
// emulated GPU and what the benchmarks' scale table measures.
#pragma once

#include <cstddef>
#include <optional>

namespace nodeemu {

// The process's peak resident set (VmHWM of /proc/self/status) in bytes; nothing where the
// kernel does not say.
std::optional<std::size_t> peak_resident_bytes();
// Starts a new peak from the current resident set (writes 5 to /proc/self/clear_refs); false
// where the kernel refuses, and the peak then covers the whole process's life.
bool reset_peak_resident();

}  // namespace nodeemu
