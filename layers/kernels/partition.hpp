// How kernels split their work over a device's worker threads: into blocks fixed by the problem
// size, never by the thread count, and each output element is computed inside one block in a
// fixed order. That is what makes a kernel's bits independent of how many threads ran it.
#pragma once
#include <algorithm>
#include <cstdint>

#include "devices/worker_pool.hpp"

namespace nodeemu::layers::kernels {

inline constexpr std::int64_t kRowBlock = 64;
inline constexpr std::int64_t kColumnBlock = 64;

// f(row) for every row; rows are independent.
template <class F>
void for_row_blocks(std::int64_t rows, F&& f) {
  const std::int64_t blocks = (rows + kRowBlock - 1) / kRowBlock;
  WorkerPool::parallel_for(static_cast<std::size_t>(blocks), [&](std::size_t b) {
    const std::int64_t r0 = std::int64_t(b) * kRowBlock, r1 = std::min(rows, r0 + kRowBlock);
    for (std::int64_t r = r0; r < r1; ++r) f(r);
  });
}

// f(begin, end) for column ranges: for reductions over rows, each column owned by one block.
template <class F>
void for_column_blocks(std::int64_t cols, F&& f) {
  const std::int64_t blocks = (cols + kColumnBlock - 1) / kColumnBlock;
  WorkerPool::parallel_for(static_cast<std::size_t>(blocks), [&](std::size_t b) {
    const std::int64_t c0 = std::int64_t(b) * kColumnBlock;
    f(c0, std::min(cols, c0 + kColumnBlock));
  });
}

}  // namespace nodeemu::layers::kernels
