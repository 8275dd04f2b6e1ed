// Emulated memory: device memory on an emulated GPU, or pinned/pageable host memory on an
// emulated NUMA node. A Buffer is a shared handle. Its memory is returned to the device's
// account (virtual time) when the last handle is dropped *and* its last use on a stream other
// than the compute (default) stream has completed; uses on the compute stream do not hold it,
// since what the host allocates next runs after them. That is PyTorch's caching allocator with
// record_stream on the side streams. The real bytes are freed once every use has run for real.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace nodeemu {

namespace detail {
struct BufferState;
class BufferGuard;
}  // namespace detail

enum class MemoryKind { Device, PinnedHost, PageableHost };

class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(std::shared_ptr<detail::BufferGuard> guard) : guard_(std::move(guard)) {}

  explicit operator bool() const { return guard_ != nullptr; }
  // `bytes` bytes of this buffer from `offset`: the same memory, accounted once, alive while any
  // view of it is (a torch view of a flat tensor). Megatron's parameters and gradients are such
  // views of their data-parallel bucket. Throws UsageError past the end.
  Buffer slice(std::size_t offset, std::size_t bytes) const;
  std::size_t bytes() const;   // of this view
  std::size_t offset() const;  // of this view in its allocation
  MemoryKind kind() const;
  int device() const;     // -1 for host memory
  int numa() const;       // emulated NUMA node (host memory, or device's local)
  int real_numa() const;  // where the bytes really are; -1 if unknown or meta
  bool is_meta() const;   // shape only, no data
  const std::vector<std::int64_t>& shape() const;  // the allocation's
  // Throws UsageError for a meta buffer: meta mode has no data to read.
  void* data() const;
  template <class T>
  T* as() const {
    return static_cast<T*>(data());
  }
  detail::BufferState* state() const;

 private:
  static constexpr std::size_t kWhole = ~std::size_t{0};
  std::shared_ptr<detail::BufferGuard> guard_;
  std::size_t offset_ = 0, length_ = kWhole;
};

}  // namespace nodeemu
