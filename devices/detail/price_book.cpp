#include "devices/detail/price_book.hpp"

#include <algorithm>
#include <cstring>

#include "devices/cost_model.hpp"
#include "devices/errors.hpp"

namespace nodeemu::detail {

namespace {

// Folds a field into the running hash with one multiply (a chain of full avalanches per field
// cost 5 % of the bare engine's time); finish() avalanches the whole once. The fields are small
// integers and doubles that differ in few bits, and boost's hash_combine over the identity hash
// of an integer left a step's ~11 k shapes in long bucket chains.
void mix(std::uint64_t& h, std::uint64_t v) {
  h = (h ^ v) * 0x9e3779b97f4a7c15ULL;
}

std::uint64_t finish(std::uint64_t h) {  // the murmur3 finaliser
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ULL;
  return h ^ (h >> 33);
}

std::uint64_t bits(double d) {
  std::uint64_t u;
  std::memcpy(&u, &d, sizeof u);
  return u;
}

bool same_shape(const KernelShape& a, const KernelShape& b) {
  return a.kind == b.kind && a.layout == b.layout && a.m == b.m && a.n == b.n && a.k == b.k &&
         a.groups == b.groups && a.backend == b.backend && a.backward == b.backward &&
         a.causal == b.causal && a.batch == b.batch && a.seq == b.seq && a.kv_seq == b.kv_seq &&
         a.q_heads == b.q_heads && a.kv_heads == b.kv_heads && a.d_qk == b.d_qk && a.d_v == b.d_v &&
         a.op == b.op;
}

}  // namespace

bool PriceBook::Key::operator==(const Key& o) const {
  return gpu == o.gpu && same_shape(shape, o.shape) && flops == o.flops && bytes == o.bytes &&
         fixed_s == o.fixed_s && precision == o.precision;
}

std::uint64_t PriceBook::hash(const Key& k) {
  // Two independent chains, joined at the end: one chain of eleven multiplies was a serial
  // dependency of ~50 cycles on every launch (3 % of the bare engine's samples).
  const KernelShape& s = k.shape;
  std::uint64_t a = reinterpret_cast<std::uintptr_t>(k.gpu);
  std::uint64_t b = 0x243f6a8885a308d3ULL;
  mix(a, std::uint64_t(s.kind) | std::uint64_t(s.layout) << 8 | std::uint64_t(s.op) << 16 |
             std::uint64_t(s.backend) << 24 | std::uint64_t(s.backward) << 32 |
             std::uint64_t(s.causal) << 33 | std::uint64_t(k.precision) << 40);
  mix(b, std::uint64_t(s.m));
  mix(a, std::uint64_t(s.n));
  mix(b, std::uint64_t(s.k));
  mix(a, std::uint64_t(s.groups));
  mix(b, std::uint64_t(s.batch) * 131 + std::uint64_t(s.seq) * 7 + std::uint64_t(s.kv_seq));
  mix(a, std::uint64_t(std::uint32_t(s.q_heads)) << 32 | std::uint32_t(s.kv_heads));
  mix(b, std::uint64_t(std::uint32_t(s.d_qk)) << 32 | std::uint32_t(s.d_v));
  mix(a, bits(k.flops));
  mix(b, bits(k.bytes));
  mix(a, bits(k.fixed_s));
  return finish(a ^ (b >> 1 | b << 63));
}

PriceBook::Slot& PriceBook::slot_for(const Key& k, std::uint64_t h) {
  const std::size_t mask = slots_.size() - 1;
  for (std::size_t i = h & mask;; i = (i + 1) & mask) {
    Slot& s = slots_[i];
    if (s.entry == 0 || (s.hash == h && entries_[s.entry - 1].key == k)) return s;
  }
}

void PriceBook::grow() {
  slots_.assign(std::max<std::size_t>(1024, slots_.size() * 2), Slot{});
  for (std::size_t e = 0; e < entries_.size(); ++e) {
    const std::uint64_t h = hash(entries_[e].key);
    slot_for(entries_[e].key, h) = {h, static_cast<std::uint32_t>(e + 1)};
  }
}

double PriceBook::seconds(const GpuSpec& gpu, const Work& w, const std::string& kernel) {
  const Key key{&gpu, w.shape, w.flops, w.bytes, w.fixed_s, w.precision};
  const std::uint64_t h = hash(key);
  if (2 * (entries_.size() + 1) > slots_.size()) grow();
  Slot& slot = slot_for(key, h);
  if (slot.entry == 0) {
    entries_.push_back({key, kernel_price(gpu, w)});
    slot = {h, static_cast<std::uint32_t>(entries_.size())};
  }
  Entry& entry = entries_[slot.entry - 1];
  const KernelPrice& price = entry.price;
  // The name last noted for this shape first: a launch's name is almost always its shape's last
  // one, and the map lookup it saves compared strings on every unpriced launch.
  if (!price.from_table && !(entry.noted && kernel == entry.noted_as)) {
    if (!unpriced_.count(kernel)) {
      const std::string what = describe(w.shape);
      if (gpu.profile && gpu.profile->complete())
        throw UsageError("kernel '" + kernel + "' (" + what + ") has no table in GPU profile '" +
                         gpu.profile->name() +
                         "', which says it is complete; measure the kernel or set complete: "
                         "false in its profile.yaml");
      unpriced_[kernel] = what;
    }
    entry.noted_as = kernel;
    entry.noted = true;
  }
  return price.seconds;
}

}  // namespace nodeemu::detail
