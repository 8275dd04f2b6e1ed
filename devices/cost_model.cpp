#include "devices/cost_model.hpp"

#include <algorithm>

#include "devices/errors.hpp"

namespace nodeemu {

void GpuSpec::use_profile(std::shared_ptr<const GpuProfile> p) {
  const HostCosts& h = p->host_costs();
  kernel_launch_host_s = h.launch_s;
  memcpy_launch_host_s = h.launch_s;  // a copy is one eager op too (tensor.copy_)
  event_record_host_s = h.event_record_s;
  stream_wait_host_s = h.stream_wait_s;
  sync_host_s = h.synchronize_s;
  graph_kernel_host_s = h.graph_kernel_s;
  forward_kernel_host_s = h.forward_kernel_s > 0 ? h.forward_kernel_s : h.launch_s;
  backward_kernel_host_s = h.backward_kernel_s > 0 ? h.backward_kernel_s : h.launch_s;
  small_d2h_sync_host_s = h.small_d2h_sync_s;
  launch_latency_s = h.launch_latency_s;
  contention = p->contention();
  pcie_duplex = p->pcie_duplex_factor();
  profile = std::move(p);
}

KernelPrice kernel_price(const GpuSpec& gpu, const Work& w) {
  if (gpu.profile) return gpu.profile->price(w);
  if (w.fixed_s > 0) return {w.fixed_s, true};
  double peak = w.precision == Precision::FP32                       ? gpu.fp32_flops
                : w.precision == Precision::FP8 && gpu.fp8_flops > 0 ? gpu.fp8_flops
                                                                     : gpu.bf16_flops;
  double t = 0;
  if (w.flops > 0 && peak > 0) t = std::max(t, w.flops / peak);
  if (w.bytes > 0 && gpu.hbm_bytes_per_s > 0) t = std::max(t, w.bytes / gpu.hbm_bytes_per_s);
  return {t, false};
}

double copy_seconds(const GpuSpec& gpu, const PcieSpec& pcie, CopyDirection dir, double bytes,
                    bool pageable, bool remote_numa) {
  if (!gpu.profile)
    throw UsageError("copy: GPU '" + gpu.name +
                     "' has no profile to price copies with; name one in the topology "
                     "(gpu.profile)");
  const double t = gpu.profile->copy_seconds(dir, bytes, pageable);
  if (dir == CopyDirection::DeviceToDevice || !remote_numa) return t;
  const double start = gpu.profile->copy_seconds(dir, 1, pageable);
  return start + std::max(0.0, t - start) / pcie.remote_numa_factor;
}

}  // namespace nodeemu
