// Internal (layers/): splitmix64 (Steele, Lea and Flood 2014), the counter-based stream behind
// meta mode's routing draws. One definition, so that every draw reads the same stream: the
// draws are pinned by tests/layers/meta_routing_test.cpp and feed every meta timeline hash.
#pragma once
#include <cstdint>

namespace nodeemu::layers::detail {

inline constexpr std::uint64_t kSplitMixGamma = 0x9e3779b97f4a7c15ULL;
inline constexpr std::uint64_t kSplitMixMul1 = 0xbf58476d1ce4e5b9ULL;
inline constexpr std::uint64_t kSplitMixMul2 = 0x94d049bb133111ebULL;

// The output function: a bijection of 64-bit words with good avalanche.
constexpr std::uint64_t splitmix64_finalise(std::uint64_t z) {
  z = (z ^ (z >> 30)) * kSplitMixMul1;
  z = (z ^ (z >> 27)) * kSplitMixMul2;
  return z ^ (z >> 31);
}

// The stream: word n of a stream that starts at `state` is splitmix64_finalise(state + n * gamma),
// n = 1, 2, ...: any word can be made without the ones before it.
struct SplitMix64 {
  std::uint64_t state;
  std::uint64_t next() { return splitmix64_finalise(state += kSplitMixGamma); }
};

}  // namespace nodeemu::layers::detail
