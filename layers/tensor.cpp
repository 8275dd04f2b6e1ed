#include "layers/tensor.hpp"

#include <algorithm>

#include "devices/device.hpp"
#include "devices/errors.hpp"

namespace nodeemu::layers {

std::int64_t numel_of(const Shape& s) {
  std::int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? "," : "") + std::to_string(s[i]);
  return out + "]";
}

Tensor::Tensor(Buffer buffer, Shape shape, DType dtype)
    : buffer_(std::move(buffer)),
      shape_(std::move(shape)),
      dtype_(dtype),
      meta_(buffer_ && buffer_.is_meta()) {}

Tensor Tensor::empty(Device& device, Shape shape, DType dtype) {
  for (auto d : shape)
    if (d < 0) throw UsageError("tensor: negative dimension in shape " + shape_str(shape));
  const std::size_t bytes = static_cast<std::size_t>(numel_of(shape)) * dtype_bytes(dtype);
  // The shape stays with the tensor; the buffer is its bytes (Buffer::shape() is for programs
  // against devices/ alone, and a copy here was one allocation per tensor).
  Buffer b = device.allocate(std::max<std::size_t>(bytes, 1));
  return Tensor(std::move(b), std::move(shape), dtype);
}

std::vector<float> Tensor::to_f32() const {
  std::vector<float> out(static_cast<std::size_t>(numel()));
  if (!out.empty()) layers::to_f32(dtype_, buffer_.data(), out.data(), out.size());
  return out;
}

void Tensor::copy_from_f32(const std::vector<float>& values) const {
  if (values.size() != static_cast<std::size_t>(numel()))
    throw UsageError("tensor: copy_from_f32 of " + std::to_string(values.size()) +
                     " values into a tensor of shape " + shape_str(shape_));
  if (!values.empty()) from_f32(dtype_, values.data(), buffer_.data(), values.size());
}

}  // namespace nodeemu::layers
