#include "comm/flex_kernel_speed.hpp"

#include <array>
#include <span>
#include <utility>

namespace nodeemu {

namespace {

// (SMs, GB/s) of bf16 dispatch through the Torch API, B200, 8 ranks, 4096 tokens of hidden
// 7168, top-8 (DeepEP hybrid-ep branch, docs/README_Hybrid-EP.md, performance table; commit
// 94a9f8f6). The DeepEP rows sweep SMs; the curve flattens near 640 GB/s from 32 SMs on.
constexpr std::array<std::pair<int, double>, 8> kDeepEp = {
    {{16, 348}, {24, 494}, {28, 560}, {32, 619}, {36, 635}, {40, 629}, {44, 640}, {48, 646}}};
// HybridEP: 535.94 GB/s at 16 SMs on the same B200 table, and no gain from 16 to 32 SMs on
// GB200 with 8 ranks (550.10 -> 545.71 GB/s, same README, GB200 table): TMA copies need few SMs.
constexpr std::array<std::pair<int, double>, 2> kHybridEp = {{{16, 535.94}, {32, 545.71}}};

double interpolate(std::span<const std::pair<int, double>> pts, int sms) {
  double x0 = 0, y0 = 0;
  for (const auto& [x, y] : pts) {
    if (sms <= x) return y0 + (y - y0) * (double(sms) - x0) / (double(x) - x0);
    x0 = x;
    y0 = y;
  }
  return y0;
}

}  // namespace

double flex_kernel_bytes_per_s(FlexBackend backend, int sms) {
  const double gb_s =
      backend == FlexBackend::DeepEP ? interpolate(kDeepEp, sms) : interpolate(kHybridEp, sms);
  return gb_s * 1e9;
}

}  // namespace nodeemu
