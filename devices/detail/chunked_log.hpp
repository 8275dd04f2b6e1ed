// Internal: an append-only sequence indexed by position whose elements never move, allocated a
// chunk of 1 << kChunkBits elements at a time. The store under the engine's operation table
// (op_table.hpp): references to an element stay valid while more are added, as with a std::deque,
// but libstdc++'s deque allocates 512 bytes at a time (two 256-byte operations), which cost an
// allocation every second operation and scattered neighbours over the heap.
#pragma once
#include <cstddef>
#include <memory>
#include <vector>

namespace nodeemu::detail {

template <class T, unsigned kChunkBits = 10>
class ChunkedLog {
 public:
  static constexpr std::size_t kChunk = std::size_t(1) << kChunkBits;

  std::size_t size() const { return size_; }
  T& operator[](std::size_t i) { return chunks_[i >> kChunkBits][i & (kChunk - 1)]; }
  const T& operator[](std::size_t i) const { return chunks_[i >> kChunkBits][i & (kChunk - 1)]; }
  // A value-initialised element at the end (as emplace_back() makes one): a new chunk's elements
  // are all value-initialised when it is allocated.
  T& emplace_back() {
    if ((size_ & (kChunk - 1)) == 0) chunks_.push_back(std::make_unique<T[]>(kChunk));
    T& t = chunks_.back()[size_ & (kChunk - 1)];
    ++size_;
    return t;
  }

 private:
  std::vector<std::unique_ptr<T[]>> chunks_;
  std::size_t size_ = 0;
};

}  // namespace nodeemu::detail
