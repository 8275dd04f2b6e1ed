// A layer tensor: a device Buffer with a shape and an element type. In meta mode the buffer is a
// meta buffer (shape and memory accounting, no data), and every kernel that touches the tensor
// skips its body, so the same layer code runs in both modes.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "devices/buffer.hpp"
#include "devices/small_vector.hpp"
#include "layers/dtype.hpp"

namespace nodeemu {
class Device;
}

namespace nodeemu::layers {

// A tensor's dimensions, up to four held inline: a meta step makes millions of tensors and
// copies their shapes into launches and saved lists; a heap vector was one allocation each.
using Shape = boost::container::small_vector<std::int64_t, 4>;

std::int64_t numel_of(const Shape& s);
std::string shape_str(const Shape& s);

class Tensor {
 public:
  Tensor() = default;
  Tensor(Buffer buffer, Shape shape, DType dtype);
  // Zero-filled device memory for `shape` (at least one byte is allocated for an empty tensor,
  // so that zero-row tensors still have a buffer to name). Throws OutOfMemory.
  static Tensor empty(Device& device, Shape shape, DType dtype);

  explicit operator bool() const { return static_cast<bool>(buffer_); }
  const Buffer& buffer() const { return buffer_; }
  const Shape& shape() const { return shape_; }
  std::int64_t dim(int i) const { return shape_.at(static_cast<std::size_t>(i)); }
  std::int64_t numel() const { return numel_of(shape_); }
  std::size_t bytes() const { return static_cast<std::size_t>(numel()) * dtype_bytes(dtype_); }
  DType dtype() const { return dtype_; }
  // Kept from construction: every kernel asks it of every tensor it views, and the buffer's
  // state is a pointer chase to a cold line (2 % of a Qwen3 meta step).
  bool is_meta() const { return meta_; }

  template <class T>
  T* data() const {
    return buffer_.as<T>();
  }

  // Host access for tests and setup (functional mode; the caller has synchronized): the values
  // as fp32, and a write that rounds to the tensor's type.
  std::vector<float> to_f32() const;
  void copy_from_f32(const std::vector<float>& values) const;

 private:
  Buffer buffer_;
  Shape shape_;
  DType dtype_ = DType::F32;
  bool meta_ = false;
};

}  // namespace nodeemu::layers
