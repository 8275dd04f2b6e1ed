#include "emu/multi_tensor_apply.hpp"

#include <array>

#include "devices/check.hpp"

namespace nodeemu::emu {

namespace {
constexpr std::int64_t kChunk = 2048 * 32;
constexpr int kMaxBlocks = 320;
constexpr std::array<int, 5> kMaxTensors = {110, 64, 48, 36, 30};
}  // namespace

std::vector<MultiTensorLaunch> multi_tensor_launches(const std::vector<std::int64_t>& numels,
                                                     int depth) {
  NE_CHECK(depth >= 1 && depth <= int(kMaxTensors.size()),
           "multi_tensor_launches: depth out of range");
  const int max_tensors = kMaxTensors[std::size_t(depth - 1)];
  // The last tensor with elements: the list's last chunk is its last.
  std::size_t last = numels.size();
  for (std::size_t t = 0; t < numels.size(); ++t)
    if (numels[t] > 0) last = t;
  std::vector<MultiTensorLaunch> out;
  MultiTensorLaunch open;
  int tensors = 0, blocks = 0;
  for (std::size_t t = 0; t < numels.size(); ++t) {
    if (numels[t] <= 0) continue;
    ++tensors;
    const std::int64_t chunks = (numels[t] + kChunk - 1) / kChunk;
    for (std::int64_t c = 0; c < chunks; ++c) {
      const std::int64_t begin = c * kChunk, end = std::min(numels[t], begin + kChunk);
      // Consecutive chunks of one tensor in one launch are one segment.
      if (!open.empty() && open.back().tensor == t && open.back().end == begin)
        open.back().end = end;
      else
        open.push_back({t, begin, end});
      ++blocks;
      const bool last_chunk = c == chunks - 1;
      if ((tensors == max_tensors && last_chunk) || blocks == kMaxBlocks ||
          (t == last && last_chunk)) {
        out.push_back(std::move(open));
        open.clear();
        blocks = 0;
        tensors = last_chunk ? 0 : 1;  // a tensor cut here carries on
      }
    }
  }
  return out;
}

}  // namespace nodeemu::emu
