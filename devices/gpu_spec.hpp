// What one emulated GPU can do: the figures the timing plane costs every operation with.
// Every number comes from a topology YAML file (configs/topologies/), never from the code.
#pragma once

#include <cstdint>
#include <string>

namespace nodeemu {

// Size-dependent efficiency: eff(x) = max * x / (x + half), so tiny kernels run far below peak
// and large ones approach `max`. `half` is the size at which half of `max` is reached.
struct EfficiencyCurve {
  double max = 1.0;
  double half = 0.0;
  double at(double x) const { return x <= 0 ? max : max * x / (x + half); }
};

struct GpuSpec {
  std::string name;                // "H100-SXM5-80GB"
  int sms = 0;                     // streaming multiprocessors
  double bf16_flops = 0;           // dense peak, FLOP/s
  double fp8_flops = 0;            // dense peak, FLOP/s
  double fp32_flops = 0;           // non-tensor-core fp32 peak, FLOP/s
  std::uint64_t hbm_bytes = 0;     // capacity
  double hbm_bytes_per_s = 0;      // bandwidth
  int cc_major = 0, cc_minor = 0;  // compute capability
  int h2d_copy_engines = 1;        // engines that can move host->device at once
  int d2h_copy_engines = 1;
  EfficiencyCurve compute_eff;  // over a kernel's FLOPs
  EfficiencyCurve memory_eff;   // over a kernel's bytes
  // Host-side costs of the driver API, charged to the launching host's virtual clock.
  double kernel_launch_host_s = 0;  // cudaLaunchKernel
  double memcpy_launch_host_s = 0;  // cudaMemcpyAsync
  double event_host_s = 0;          // cudaEventRecord / cudaStreamWaitEvent
  double sync_host_s = 0;           // return from a synchronize
  // Device-side delay from the end of the launch call to the earliest possible start.
  double launch_latency_s = 0;
};

}  // namespace nodeemu
