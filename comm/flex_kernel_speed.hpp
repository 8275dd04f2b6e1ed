// How fast DeepEP's and HybridEP's dispatch kernels move tokens with a given number of SMs, from
// the published sweeps (flex_kernel_speed.cpp has every point with its source). The kernels copy
// with their own SMs, so below a few dozen SMs they, not NVLink, set the speed: giving the
// dispatcher more SMs trades compute for transfer speed.
#pragma once

#include "comm/flex_dispatcher.hpp"

namespace nodeemu {

// Bytes per second the backend's kernels move on one GPU with `sms` SMs (linear between the
// published points, through zero, flat beyond the last). An upper bound: the fabric's links
// bound the same transfer separately.
double flex_kernel_bytes_per_s(FlexBackend backend, int sms);

}  // namespace nodeemu
