// What one emulated GPU can do: the figures the timing plane costs every operation with. The
// datasheet figures come from the topology YAML (configs/topologies/) and are asymptotes only;
// kernel and copy times, host costs and contention come from the GPU profile the topology names
// (configs/gpus/, gpu_profile.hpp). Never from the code.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "devices/gpu_profile.hpp"

namespace nodeemu {

// Size-dependent efficiency: eff(x) = max * x / (x + half), so tiny messages run far below peak
// and large ones approach `max`. `half` is the size at which half of `max` is reached.
struct EfficiencyCurve {
  double max = 1.0;
  double half = 0.0;
  double at(double x) const { return x <= 0 ? max : max * x / (x + half); }
};

struct GpuSpec {
  std::string name;                // "H100-SXM5-80GB"
  int sms = 0;                     // streaming multiprocessors
  double bf16_flops = 0;           // dense peak, FLOP/s (datasheet)
  double fp8_flops = 0;            // dense peak, FLOP/s (datasheet)
  double fp32_flops = 0;           // non-tensor-core fp32 peak, FLOP/s (datasheet)
  std::uint64_t hbm_bytes = 0;     // capacity
  double hbm_bytes_per_s = 0;      // bandwidth (datasheet)
  int cc_major = 0, cc_minor = 0;  // compute capability
  int h2d_copy_engines = 1;        // engines that can move host->device at once
  int d2h_copy_engines = 1;
  // Operations a stream may have launched and not completed before a launch blocks the host until
  // the oldest completes (NVIDIA developer forum, "CUDA stream are blocked when launching lots of
  // kernels (>1000)": about 1,000 per stream, each stream its own). 0: unbounded.
  int pending_launches_per_stream = 1024;
  // The measured price list. Null only for a hand-built spec: then every kernel is priced by the
  // datasheet roofline and reported as unpriced.
  std::shared_ptr<const GpuProfile> profile;
  // Host-side costs charged to the launching host's virtual clock, from the profile's
  // host_costs.csv (eager PyTorch); a test may set round numbers.
  double kernel_launch_host_s = 0;   // one launched kernel
  double memcpy_launch_host_s = 0;   // one launched copy (an eager op too)
  double event_record_host_s = 0;    // an event record
  double stream_wait_host_s = 0;     // a stream waiting on an event
  double sync_host_s = 0;            // return from a synchronize
  double graph_kernel_host_s = 0;    // an op replayed inside a CUDA graph
  double small_d2h_sync_host_s = 0;  // a small D2H read by the host, all told, GPU idle
  // Device-side delay from the end of the launch call to the earliest possible start.
  double launch_latency_s = 0;
  // One kernel launched inside PyTorch's eager forward or autograd's backward, framework
  // included (FrameworkScope, host.hpp; the profile's host_ops.csv). A profile without that
  // table leaves them at the bare launch.
  double forward_kernel_host_s = 0;
  double backward_kernel_host_s = 0;
  Contention contention;   // how kernels sharing the GPU slow each other
  double pcie_duplex = 1;  // each PCIe direction's rate while the other also runs

  // Fills the host costs and contention from `profile` (and keeps it).
  void use_profile(std::shared_ptr<const GpuProfile> p);
};

}  // namespace nodeemu
