#include "devices/cost_model.hpp"

#include <algorithm>

namespace nodeemu {

double kernel_seconds(const GpuSpec& gpu, const Work& w) {
  if (w.fixed_s > 0) return w.fixed_s;
  double peak = gpu.bf16_flops;
  if (w.precision == Precision::FP8) peak = gpu.fp8_flops > 0 ? gpu.fp8_flops : gpu.bf16_flops;
  if (w.precision == Precision::FP32) peak = gpu.fp32_flops;
  if (w.sms > 0 && gpu.sms > 0) peak *= std::min(1.0, static_cast<double>(w.sms) / gpu.sms);
  double t_compute = w.flops > 0 ? w.flops / (peak * gpu.compute_eff.at(w.flops)) : 0.0;
  double t_memory =
      w.bytes > 0 ? w.bytes / (gpu.hbm_bytes_per_s * gpu.memory_eff.at(w.bytes)) : 0.0;
  return std::max(t_compute, t_memory);
}

double copy_seconds(const GpuSpec& gpu, const PcieSpec& pcie, CopyDirection dir, double bytes,
                    bool pageable, bool remote_numa) {
  if (dir == CopyDirection::DeviceToDevice)
    return bytes > 0 ? 2 * bytes / (gpu.hbm_bytes_per_s * gpu.memory_eff.at(2 * bytes)) : 0.0;
  double rate = dir == CopyDirection::HostToDevice ? pcie.h2d_bytes_per_s : pcie.d2h_bytes_per_s;
  if (pageable) rate *= pcie.pageable_factor;
  if (remote_numa) rate *= pcie.remote_numa_factor;
  return pcie.latency_s + bytes / rate;
}

}  // namespace nodeemu
