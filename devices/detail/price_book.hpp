// Internal: one node's kernel prices. A step launches the same few hundred shapes millions of
// times, so each distinct (work, GPU) is looked up in the profile's tables once. It also keeps
// the kernels no table priced, for the run summary's warning (or the error a complete profile
// asks for). Used by the running host only (one at a time), so it needs no lock.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "devices/gpu_spec.hpp"
#include "devices/work.hpp"

namespace nodeemu::detail {

class PriceBook {
 public:
  // Throws UsageError for a kernel no table prices when the profile says it is complete.
  double seconds(const GpuSpec& gpu, const Work& w, const std::string& kernel);
  // kernel name -> what it is, for every kernel the roofline fallback priced.
  const std::map<std::string, std::string>& unpriced() const { return unpriced_; }

 private:
  struct Key {
    const GpuSpec* gpu;
    KernelShape shape;
    double flops, bytes, fixed_s;
    Precision precision;
    bool operator==(const Key& o) const;
  };
  static std::uint64_t hash(const Key& k);
  // Open addressing with linear probing over (hash, entry) pairs, a power-of-two size at most
  // half full: a step looks up millions of launches among ~10^4 shapes, and std::unordered_map's
  // prime-modulo buckets (two divisions a lookup) and node chasing cost 4 % of a Qwen3 meta step.
  // The probed index is 16 bytes a slot, so it stays in cache; a key is compared once its hash
  // matched.
  struct Slot {
    std::uint64_t hash = 0;
    std::uint32_t entry = 0;  // 1 + the index in entries_; 0: empty
  };
  struct Entry {
    Key key;
    KernelPrice price;
    // Unpriced shapes: the last kernel name seen with it, which unpriced_ holds.
    bool noted = false;
    std::string noted_as;
  };
  Slot& slot_for(const Key& k, std::uint64_t h);
  void grow();
  std::vector<Slot> slots_;
  std::vector<Entry> entries_;
  std::map<std::string, std::string> unpriced_;
};

}  // namespace nodeemu::detail
