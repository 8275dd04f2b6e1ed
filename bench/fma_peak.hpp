// One core's fp32 FMA peak, the ceiling the benchmarks' FLOP/s figures are read against
// (vs_fma_peak): twelve independent FMA chains of the widest vector the CPU has.
#pragma once

namespace nodeemu {

// FLOP/s of one core: the median of seven timed loops, measured once per process.
double measure_fma_peak();

}  // namespace nodeemu
