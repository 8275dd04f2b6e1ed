// How layer code puts a kernel on a stream: the kernel's cost for the timing plane (flops and
// HBM bytes, from shapes only, so meta mode costs it too), and a body that reads and writes raw
// views of its tensors (never Buffer handles: the buffers ride in Kernel::uses, which keeps them
// alive exactly as long as the engine needs them).
#pragma once
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "devices/stream.hpp"
#include "layers/tensor.hpp"

namespace nodeemu::layers {

// A tensor as a kernel body sees it. Null data in meta mode (the body never runs there).
struct View {
  void* data = nullptr;
  DType dtype = DType::F32;
  std::int64_t numel = 0;
  template <class T>
  T* as() const {
    return static_cast<T*>(data);
  }
};
View view(const Tensor& t);

// fp32 access to views of any type inside a kernel body: inputs are widened (no copy for fp32),
// outputs are written in fp32 and rounded to their type when the scope ends.
class F32Scope {
 public:
  F32Scope() = default;
  F32Scope(const F32Scope&) = delete;
  F32Scope& operator=(const F32Scope&) = delete;
  ~F32Scope();
  const float* in(const View& v);
  float* out(const View& v);    // contents undefined until written
  float* inout(const View& v);  // widened, then written back
 private:
  // Widened copies are allocated without being cleared where the widening writes every element
  // (in, inout): clearing first cost a second pass over each, ~8 % of a functional run under
  // TSan, which instruments every store of it. `out` stays cleared: a kernel that reads an
  // element before writing it must read the same value in every run.
  struct Pending {
    View dst;
    std::unique_ptr<float[]> buf;
  };
  std::vector<std::unique_ptr<float[]>> inputs_;
  std::vector<Pending> outputs_;
};

// Flops and bytes of the kernels a piece of the model launched: what `meta` mode reports.
struct WorkTally {
  double flops = 0, bytes = 0;
  std::uint64_t kernels = 0;
};

// The tensors a kernel uses, by reference: a braced list of the caller's tensors or a vector of
// them, alive for the call. A list of Tensor copies cost an allocation for each one's shape and
// one for the list on every launch, millions of times in a meta step.
class KernelUses {
 public:
  KernelUses(std::initializer_list<std::reference_wrapper<const Tensor>> list) : list_(list) {}
  KernelUses(const std::vector<Tensor>& tensors) : vector_(&tensors) {}
  // These and `t` (alive for the call too): a linear pass's device-side rows.
  KernelUses and_also(const Tensor& t) const {
    KernelUses u = *this;
    u.also_ = &t;
    return u;
  }
  std::size_t size() const { return (vector_ ? vector_->size() : list_.size()) + (also_ ? 1 : 0); }
  template <class F>
  void each(F&& f) const {
    if (vector_)
      for (const Tensor& t : *vector_) f(t);
    else
      for (const Tensor& t : list_) f(t);
    if (also_) f(*also_);
  }

 private:
  std::initializer_list<std::reference_wrapper<const Tensor>> list_;
  const std::vector<Tensor>* vector_ = nullptr;
  const Tensor* also_ = nullptr;
};

// Launches `body` as kernel `name` on `stream`, with the timing plane's Work, keeping the
// buffers of `uses` alive; adds the cost to `tally` when given.
void launch(Stream& stream, std::string name, const Work& work, std::function<void()> body,
            KernelUses uses, WorkTally* tally);

// Whether kernel bodies run on the stream's node: not in meta mode.
bool runs_bodies(const Stream& stream);

// A kernel body given as a callable other than a std::function (a lambda).
template <class F>
concept BodyLambda = !std::is_same_v<std::decay_t<F>, std::function<void()>> &&
                     !std::is_null_pointer_v<std::decay_t<F>>;

// The same, for a body given as a lambda: made into a std::function only where it runs. A
// body's captures (its views, sizes and flags) outgrow std::function's inline buffer, so each
// conversion was a heap allocation, for a body that meta mode drops unrun.
template <BodyLambda Body>
void launch(Stream& stream, std::string name, const Work& work, Body&& body, KernelUses uses,
            WorkTally* tally) {
  launch(stream, std::move(name), work,
         runs_bodies(stream) ? std::function<void()>(std::forward<Body>(body))
                             : std::function<void()>(),
         uses, tally);
}

// Bytes of a set of tensors (what an elementwise kernel reads and writes).
double bytes_of(std::initializer_list<const Tensor*> ts);

}  // namespace nodeemu::layers
