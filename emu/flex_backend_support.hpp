// Which GPUs Megatron-Bridge lets each flex dispatcher backend run on
// (training/flex_dispatcher_backend.py, apply_flex_dispatcher_backend): validate refuses the
// others, and run falls back to alltoall as Bridge does.
#pragma once
#include <string>

#include "devices/gpu_spec.hpp"

namespace nodeemu::emu {

// Why `backend` ("deepep", "hybridep") cannot run on `gpu`, or "".
std::string flex_backend_unsupported(const std::string& backend, const GpuSpec& gpu);

}  // namespace nodeemu::emu
