// A 16-bit expert weight's fp32 copy in the layout the forward GEMM runs fastest on,
// kept from one call to the next.
//
// Why: every kernel widens its 16-bit inputs to fp32 per call (F32Scope), and the experts'
// forward GEMM with few rows per expert spends a large share of each call in OpenBLAS's
// transposing pack of the [out][in] weight. A weight changes once per optimizer step but is read
// by every micro-batch's forward (and recompute), so one widened, transposed ([in][out]) copy per
// change pays for itself, as Transformer Engine keeps its FP8 weight casts and transposes from a
// step's first micro-batch (transformer_engine/pytorch/module/linear.py and grouped_linear.py,
// the forward's `is_first_microbatch`). The GEMM gives the same bits on both layouts
// (layers/gemm.hpp).
//
// Validity is decided by content, not by tracking writers: the optimizer, the distributed
// optimizer's parameter all-gather and tests all write weights, and a stale copy would change
// the numerics silently. A use compares the weight's bits with the bits the copy was made from
// (one read of the 16-bit weight and its kept source, cheaper than widening it again) and makes
// a new copy when they differ. Host memory: the kept source (the weight's size) and the fp32
// transposed copy (twice it), per expert weight of the device's chunks.
//
// The comparison reads 2x the weight's bytes, which at 128 rows per expert costs ~10 % of the
// GEMM. So a caller that knows the weights cannot change for a while says so with a *weights
// generation*, as Megatron tells Transformer Engine `is_first_microbatch` (schedules.py
// forward_step; TE recasts its FP8 weights only then): within one generation only the first use
// compares, and the later ones take the copy it checked. The trainer starts a generation per
// iteration (emu/training.cpp): the optimizer step and the parameter all-gather come between
// iterations, or, with overlap_param_gather, before the first use of a weight reads it. In a
// build with assertions (the ASan+UBSan preset) every use still compares, and a weight written
// inside a generation aborts with a message.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "layers/launch.hpp"

namespace nodeemu::layers {

class TransposedWeightCopy {
 public:
  struct Copy {
    std::vector<unsigned char> source;  // the 16-bit weight's bits the copy was made from
    std::vector<float> transposed;      // [groups][in][out]
  };
  // The copy of `w` ([groups][out][in], 16-bit) for its bits as they are now. Safe to call from
  // any worker: a copy is immutable once made, and a caller holds the one it got. `generation`:
  // 0, the bits are compared at this use; otherwise the caller's promise that the weight is not
  // written while the generation lasts, so only its first use compares.
  std::shared_ptr<const Copy> of(const View& w, std::int64_t groups, std::int64_t out,
                                 std::int64_t in, std::uint64_t generation = 0);
  // How many copies were made (for tests: one per change of the weight's bits that a use saw).
  std::uint64_t made() const { return made_.load(std::memory_order_relaxed); }
  // How many uses compared the weight's bits with the copy's source.
  std::uint64_t compared() const { return compared_.load(std::memory_order_relaxed); }

 private:
  // Where a copy's storage goes when its last holder lets go, for the next copy to refill: fresh
  // pages cost more to fault in than making the copy. Shared with the copies' deleters, which may
  // outlive this object.
  struct Spare {
    std::mutex mu;
    std::unique_ptr<Copy> storage;
  };
  std::mutex mu_;
  std::shared_ptr<const Copy> kept_;
  std::uint64_t kept_generation_ = 0;  // the generation kept_ was compared or made in; 0: none
  std::shared_ptr<Spare> spare_ = std::make_shared<Spare>();
  std::atomic<std::uint64_t> made_{0}, compared_{0};
};

}  // namespace nodeemu::layers
