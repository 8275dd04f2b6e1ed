// The timing plane's price list: how long an operation takes on the target GPU when it has the
// whole device (or the whole PCIe direction) to itself. Sharing is the engine's business.
#pragma once

#include "devices/gpu_spec.hpp"
#include "devices/topology.hpp"
#include "devices/work.hpp"

namespace nodeemu {

// t = max(flops / (peak x eff_compute(flops)), bytes / (HBM bw x eff_memory(bytes))), or
// `fixed_s` when given. A communication kernel (sms > 0) is priced as if it ran on its own SMs:
// its FLOP rate scales with sms / total.
double kernel_seconds(const GpuSpec& gpu, const Work& w);

enum class CopyDirection { HostToDevice, DeviceToHost, DeviceToDevice };

// latency + bytes / rate, where the PCIe rate is scaled down for pageable host memory and for a
// host buffer on the socket that is not local to the GPU (the bindpcie question). A copy within
// HBM reads and writes every byte.
double copy_seconds(const GpuSpec& gpu, const PcieSpec& pcie, CopyDirection dir, double bytes,
                    bool pageable, bool remote_numa);

}  // namespace nodeemu
