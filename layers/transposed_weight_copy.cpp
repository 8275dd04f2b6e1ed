#include "layers/transposed_weight_copy.hpp"

#include <cstring>

#include "devices/check.hpp"

namespace nodeemu::layers {

std::shared_ptr<const TransposedWeightCopy::Copy> TransposedWeightCopy::of(
    const View& w, std::int64_t groups, std::int64_t out, std::int64_t in,
    std::uint64_t generation) {
  NE_CHECK(w.dtype == DType::BF16 || w.dtype == DType::F16,
           "a transposed weight copy of a weight that is not 16-bit");
  NE_CHECK(w.numel == groups * out * in, "a transposed weight copy of the wrong shape");
  const std::size_t bytes = std::size_t(w.numel) * dtype_bytes(w.dtype);
  const auto same_bits = [&](const Copy& c) {
    compared_.fetch_add(1, std::memory_order_relaxed);
    return c.source.size() == bytes && std::memcmp(c.source.data(), w.data, bytes) == 0;
  };
  std::shared_ptr<const Copy> kept;
  bool promised = false;
  {
    std::lock_guard lock(mu_);
    kept = kept_;
    promised = generation != 0 && kept && kept_generation_ == generation;
  }
  if (promised) {
#ifndef NDEBUG
    NE_CHECK(same_bits(*kept),
             "an expert weight was written inside a weights generation (a caller of "
             "TransposedWeightCopy::of promised it would not be)");
#endif
    return kept;
  }
  if (kept && same_bits(*kept)) {
    // A use without a generation leaves the one the copy was compared in standing.
    std::lock_guard lock(mu_);
    if (kept_ == kept && generation != 0) kept_generation_ = generation;
    return kept;
  }
  // The bits changed: let go of the old copy first, so that its storage comes back to the spare
  // (its deleter runs here when nobody else holds it, the usual case: last step's copy, every
  // kernel that read it done) and the new copy refills it instead of doubling the memory.
  {
    std::lock_guard lock(mu_);
    if (kept_ == kept) kept_.reset();
  }
  kept.reset();
  std::unique_ptr<Copy> storage;
  {
    std::lock_guard lock(spare_->mu);
    storage = std::move(spare_->storage);
  }
  if (!storage) storage = std::make_unique<Copy>();
  const std::shared_ptr<Copy> made(storage.release(),
                                   [spare = std::weak_ptr<Spare>(spare_)](Copy* c) {
                                     std::unique_ptr<Copy> back(c);
                                     if (const auto s = spare.lock()) {
                                       std::lock_guard lock(s->mu);
                                       if (!s->storage) s->storage = std::move(back);
                                     }
                                   });
  const auto* src = static_cast<const unsigned char*>(w.data);
  made->source.assign(src, src + bytes);
  made->transposed.resize(std::size_t(w.numel));
  const std::size_t per_group = std::size_t(out * in);
  for (std::int64_t g = 0; g < groups; ++g)
    to_f32_transposed(w.dtype, src + std::size_t(g) * per_group * dtype_bytes(w.dtype),
                      made->transposed.data() + std::size_t(g) * per_group, out, in);
  made_.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard lock(mu_);
  kept_ = made;
  kept_generation_ = generation;
  return made;
}

}  // namespace nodeemu::layers
