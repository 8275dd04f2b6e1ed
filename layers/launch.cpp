#include "layers/launch.hpp"

#include "devices/device.hpp"
#include "devices/node.hpp"

namespace nodeemu::layers {

View view(const Tensor& t) {
  return View{t.is_meta() ? nullptr : t.buffer().data(), t.dtype(), t.numel()};
}

F32Scope::~F32Scope() {
  for (auto& p : outputs_)
    if (p.dst.numel > 0) from_f32(p.dst.dtype, p.buf.get(), p.dst.data, std::size_t(p.dst.numel));
}

const float* F32Scope::in(const View& v) {
  if (v.dtype == DType::F32) return v.as<const float>();
  const auto n = std::size_t(v.numel);
  float* b = inputs_.emplace_back(std::make_unique_for_overwrite<float[]>(n)).get();
  if (n > 0) to_f32(v.dtype, v.data, b, n);
  return b;
}

float* F32Scope::out(const View& v) {
  if (v.dtype == DType::F32) return v.as<float>();
  return outputs_.emplace_back(Pending{v, std::make_unique<float[]>(std::size_t(v.numel))})
      .buf.get();
}

float* F32Scope::inout(const View& v) {
  if (v.dtype == DType::F32) return v.as<float>();
  const auto n = std::size_t(v.numel);
  float* b =
      outputs_.emplace_back(Pending{v, std::make_unique_for_overwrite<float[]>(n)}).buf.get();
  if (n > 0) to_f32(v.dtype, v.data, b, n);
  return b;
}

void launch(Stream& stream, std::string name, const Work& work, std::function<void()> body,
            KernelUses uses, WorkTally* tally) {
  Kernel k{std::move(name), work, std::move(body), {}};
  uses.each([&](const Tensor& t) {
    if (t) k.uses.push_back(t.buffer());
  });
  if (tally) {
    tally->flops += work.flops;
    tally->bytes += work.bytes;
    ++tally->kernels;
  }
  stream.launch(std::move(k));
}

bool runs_bodies(const Stream& stream) {
  return stream.device().node().mode() == Mode::Functional;
}

double bytes_of(std::initializer_list<const Tensor*> ts) {
  double b = 0;
  for (auto* t : ts)
    if (t && *t) b += double(t->bytes());
  return b;
}

}  // namespace nodeemu::layers
