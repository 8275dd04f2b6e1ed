// A trainable weight and its fp32 gradient (Megatron's main_grad: gradients accumulate in fp32
// whatever the parameter's type).
//
// Initial values come from a counter-based generator keyed by (seed, name, global element
// index), so a weight has the same values whatever the parallel layout: expert e's weights are
// the same on the one device of the reference and on the EP rank that owns it.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "layers/tensor.hpp"

namespace nodeemu {
class Device;
}

namespace nodeemu::layers {

class TransposedWeightCopy;

enum class Init { Normal, Ones };

struct Parameter {
  std::string name;  // Megatron's state-dict name, e.g. "decoder.layers.0.mlp.router.weight"
  Tensor value;
  Tensor main_grad;     // fp32, zeroed by zero_grad()
  bool expert = false;  // expert weights reduce over the expert-data-parallel group
  // Megatron's `sequence_parallel` attribute: a weight every TP rank holds whole (norms, the
  // router) whose gradient each rank computes from its own tokens only, so it is all-reduced
  // over the TP group (finalize_model_grads' _allreduce_layernorm_grads).
  bool sequence_parallel = false;
  // Where local element i sits in the whole (unsharded) weight: a TP shard is not one contiguous
  // range of it. For putting shards back together (tests, a checkpoint's export).
  std::function<std::int64_t(std::int64_t)> whole_index;
  // The host's kept fp32 copy of a 16-bit expert weight for the forward GEMM
  // (keep_forward_copy; layers/transposed_weight_copy.hpp). An emulator speed-up, not
  // model state: it is checked against the weight's bits at every use.
  std::shared_ptr<TransposedWeightCopy> forward_copy;
};

using ShardIndex = std::function<std::int64_t(std::int64_t)>;

// Allocates and initialises a parameter. `global_offset` is the index of this shard's first
// element in the whole (unsharded) weight: for local expert i of EP rank r, (r * local + i) *
// per-expert elements. Values are drawn on the host (setup, not a timed kernel); in meta mode
// nothing is drawn.
Parameter make_parameter(Device& device, std::string name, Shape shape, DType dtype, Init init,
                         double std, std::uint64_t seed, std::int64_t global_offset = 0,
                         bool expert = false);
// The same for a shard whose elements sit where `global` says.
Parameter make_parameter(Device& device, std::string name, Shape shape, DType dtype, Init init,
                         double std, std::uint64_t seed, const ShardIndex& global);

// Gives a 16-bit [groups][out][in] expert weight a kept forward copy (functional mode only, with
// a layout-independent GEMM kernel (devices/blas_kernel.hpp); a no-op for other weights), which
// ops::linear_forward then uses on the grouped GEMM's path.
void keep_forward_copy(Parameter& p);

// A standard-normal draw that depends only on (seed, stream, index).
double counter_normal(std::uint64_t seed, std::uint64_t stream, std::uint64_t index);
std::uint64_t name_hash(const std::string& s);

}  // namespace nodeemu::layers
