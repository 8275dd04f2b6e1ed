#include "layers/parameter.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "devices/blas_kernel.hpp"
#include "devices/device.hpp"
#include "devices/worker_pool.hpp"
#include "layers/detail/normal_fill.hpp"
#include "layers/detail/splitmix64.hpp"
#include "layers/transposed_weight_copy.hpp"

namespace nodeemu::layers {

namespace {
std::uint64_t splitmix(std::uint64_t x) {
  return detail::splitmix64_finalise(x + detail::kSplitMixGamma);
}
}  // namespace

std::uint64_t name_hash(const std::string& s) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

double counter_normal(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) {
  const std::uint64_t a = splitmix(seed ^ splitmix(stream ^ splitmix(2 * index)));
  const std::uint64_t b = splitmix(seed ^ splitmix(stream ^ splitmix(2 * index + 1)));
  const double u1 = (double(a >> 11) + 1.0) / 9007199254740993.0;  // (0, 1]
  const double u2 = double(b >> 11) / 9007199254740992.0;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

Parameter make_parameter(Device& device, std::string name, Shape shape, DType dtype, Init init,
                         double std, std::uint64_t seed, std::int64_t global_offset, bool expert) {
  Parameter p = make_parameter(device, std::move(name), std::move(shape), dtype, init, std, seed,
                               [global_offset](std::int64_t i) { return global_offset + i; });
  p.expert = expert;
  return p;
}

Parameter make_parameter(Device& device, std::string name, Shape shape, DType dtype, Init init,
                         double std, std::uint64_t seed, const ShardIndex& global) {
  Parameter p;
  p.value = Tensor::empty(device, shape, dtype);
  p.main_grad = Tensor::empty(device, shape, DType::F32);
  if (!p.value.is_meta()) {
    std::vector<float> v(static_cast<std::size_t>(p.value.numel()));
    // Expert shards share one stream per weight name with the shard index stripped by the
    // caller, so the offset alone places a shard.
    const std::uint64_t stream = name_hash(name);
    // Each value is a function of its index alone, so the device's idle workers may share the
    // fill with the host: the same bits, whoever draws them. Drawn on the host alone it was ~7 %
    // of a mid-size functional run (bench_emu BM_FunctionalMidSize), with the workers idle.
    constexpr std::size_t kChunk = 1 << 15;
    const std::size_t chunks = (v.size() + kChunk - 1) / kChunk;
    device.pool().parallel_for_from_host(chunks, [&](std::size_t c) {
      const std::size_t begin = c * kChunk, end = std::min(v.size(), begin + kChunk);
      if (init == Init::Ones)
        std::fill(v.begin() + std::ptrdiff_t(begin), v.begin() + std::ptrdiff_t(end), 1.0f);
      else
        detail::fill_counter_normals(seed, stream, std, global, std::int64_t(begin), end - begin,
                                     v.data() + begin);
    });
    p.value.copy_from_f32(v);
  }
  p.name = std::move(name);
  p.whole_index = global;
  return p;
}

void keep_forward_copy(Parameter& p) {
  // The copy runs the forward on the other layout: a pure speed-up only with a kernel whose bits
  // do not depend on it (a user's OPENBLAS_CORETYPE may pick one that does).
  if (!blas::ensure_kernel().layout_independent()) return;
  const DType t = p.value.dtype();
  if ((t == DType::BF16 || t == DType::F16) && p.value.shape().size() == 3 && !p.value.is_meta())
    p.forward_copy = std::make_shared<TransposedWeightCopy>();
}

}  // namespace nodeemu::layers
