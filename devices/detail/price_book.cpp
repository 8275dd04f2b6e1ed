#include "devices/detail/price_book.hpp"

#include <cstring>
#include <functional>

#include "devices/cost_model.hpp"
#include "devices/errors.hpp"

namespace nodeemu::detail {

namespace {

template <class T>
void mix(std::size_t& h, const T& v) {
  h ^= std::hash<T>{}(v) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
}

bool same_shape(const KernelShape& a, const KernelShape& b) {
  return a.kind == b.kind && a.layout == b.layout && a.m == b.m && a.n == b.n && a.k == b.k &&
         a.groups == b.groups && a.backend == b.backend && a.backward == b.backward &&
         a.causal == b.causal && a.batch == b.batch && a.seq == b.seq && a.q_heads == b.q_heads &&
         a.kv_heads == b.kv_heads && a.d_qk == b.d_qk && a.d_v == b.d_v && a.op == b.op;
}

}  // namespace

bool PriceBook::Key::operator==(const Key& o) const {
  return gpu == o.gpu && same_shape(shape, o.shape) && flops == o.flops && bytes == o.bytes &&
         fixed_s == o.fixed_s && precision == o.precision;
}

std::size_t PriceBook::Hash::operator()(const Key& k) const {
  std::size_t h = std::hash<const void*>{}(k.gpu);
  const KernelShape& s = k.shape;
  mix(h, int(s.kind));
  mix(h, s.m);
  mix(h, s.n);
  mix(h, s.k);
  mix(h, s.groups);
  mix(h, s.seq * 131 + s.batch);
  mix(h, (s.q_heads << 16) ^ (s.kv_heads << 8) ^ s.d_qk ^ (s.d_v << 20));
  mix(h, int(s.layout) | int(s.op) << 4 | int(s.backend) << 8 | int(s.backward) << 10 |
             int(s.causal) << 11 | int(k.precision) << 12);
  mix(h, k.flops);
  mix(h, k.bytes);
  mix(h, k.fixed_s);
  return h;
}

double PriceBook::seconds(const GpuSpec& gpu, const Work& w, const std::string& kernel) {
  Key key{&gpu, w.shape, w.flops, w.bytes, w.fixed_s, w.precision};
  auto it = cache_.find(key);
  if (it == cache_.end()) it = cache_.emplace(key, kernel_price(gpu, w)).first;
  if (!it->second.from_table && !unpriced_.count(kernel)) {
    const std::string what = describe(w.shape);
    if (gpu.profile && gpu.profile->complete())
      throw UsageError("kernel '" + kernel + "' (" + what + ") has no table in GPU profile '" +
                       gpu.profile->name() +
                       "', which says it is complete; measure the kernel or set complete: false "
                       "in its profile.yaml");
    unpriced_[kernel] = what;
  }
  return it->second.seconds;
}

}  // namespace nodeemu::detail
