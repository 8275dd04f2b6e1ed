// The timing plane's price list for one GPU: how long an operation takes when it has the whole
// device (or its copy engine) to itself, from the GPU's measured profile. Sharing is the engine's
// business (contention, from the same profile).
#pragma once

#include "devices/gpu_spec.hpp"
#include "devices/topology.hpp"
#include "devices/work.hpp"

namespace nodeemu {

// From the profile's tables (GpuProfile::price); a spec without a profile prices every kernel by
// the datasheet roofline, reported as unpriced.
KernelPrice kernel_price(const GpuSpec& gpu, const Work& w);

// A copy through its engine: the profile's PCIe table by direction, host memory kind and size.
// A host buffer on the socket that is not local to the GPU (the bindpcie question) moves its
// bytes at the topology's remote_numa_factor of the rate; the fixed start-up stays.
double copy_seconds(const GpuSpec& gpu, const PcieSpec& pcie, CopyDirection dir, double bytes,
                    bool pageable, bool remote_numa);

}  // namespace nodeemu
