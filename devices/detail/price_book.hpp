// Internal: one node's kernel prices. A step launches the same few hundred shapes millions of
// times, so each distinct (work, GPU) is looked up in the profile's tables once. It also keeps
// the kernels no table priced, for the run summary's warning (or the error a complete profile
// asks for). Used by the running host only (one at a time), so it needs no lock.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>

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
  struct Hash {
    std::size_t operator()(const Key& k) const;
  };
  std::unordered_map<Key, KernelPrice, Hash> cache_;
  std::map<std::string, std::string> unpriced_;
};

}  // namespace nodeemu::detail
