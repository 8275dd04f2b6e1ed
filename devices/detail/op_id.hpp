// An operation of the engine (a kernel, a copy, a record, a wait, a rendezvous party), by the
// order it was issued in: ids are dense and never reused, so a vector indexes them.
#pragma once

#include <cstdint>

namespace nodeemu::detail {

using OpId = std::uint32_t;
inline constexpr OpId kNoOp = UINT32_MAX;

}  // namespace nodeemu::detail
