#include "emu/step_reductions.hpp"

#include <cstring>

#include "devices/check.hpp"
#include "devices/device.hpp"
#include "devices/node.hpp"

namespace nodeemu::emu {

namespace {

Work small(double bytes) {
  return Work{.bytes = bytes, .shape = KernelShape::memory(MemoryOp::Elementwise)};
}

// torch.tensor([value], device="cuda"), all-reduced over `g`, then `.item()` `reads` times.
// Returns what the last read saw (functional mode) or `value` (meta).
float reduce_host_value(Group& g, float value, Reduction op, int reads, const std::string& name,
                        Stream& s) {
  Device& dev = s.device();
  const bool functional = dev.node().mode() == Mode::Functional;
  // From pageable host memory, as torch.tensor(list, device=...) copies it.
  Buffer from = dev.allocate_host(sizeof(float), /*pinned=*/false);
  if (functional) std::memcpy(from.as<float>(), &value, sizeof value);
  Buffer stat = dev.allocate(sizeof(float));
  s.copy(stat, from, sizeof(float), name + " torch.tensor");
  g.all_reduce(stat, stat, 1, s, {.name = name + "_allreduce"}, op);
  Buffer back = dev.allocate_host(sizeof(float));
  for (int i = 0; i < reads; ++i) s.read_to_host(back, stat, sizeof(float), name + " .item()");
  return functional ? *back.as<float>() : value;
}

}  // namespace

void reduce_step_statistics(Group& mp, std::optional<Group> dp_cp, int microbatches,
                            std::function<double()> loss_share, double tokens, Stream& s) {
  // update_successful: a MIN over int flags, here the MAX of the negated flag.
  const float all_succeeded =
      -reduce_host_value(mp, -1.0f, Reduction::MaxF32, 1, "update_successful", s);
  NE_CHECK(all_succeeded == 1.0f,
           "reduce_step_statistics: a rank's optimizer step did not succeed");
  // The gradient norm: MAX, read twice. Its value is only logged, so 0.0 stands in for it
  // (the optimizer reports the real one, Optimizer::last_grad_norm); the timing is the same.
  reduce_host_value(mp, 0.0f, Reduction::MaxF32, 2, "grad_norm", s);
  if (!dp_cp) return;
  Device& dev = s.device();
  const bool functional = dev.node().mode() == Mode::Functional;
  Buffer stacked = dev.allocate(2 * sizeof(float) * std::size_t(microbatches));
  Buffer sum = dev.allocate(2 * sizeof(float));
  std::function<void()> stack, add;
  if (functional) {
    // The step's totals, as micro-batch 0's entry: the sum over micro-batches is the same.
    stack = [out = stacked.as<float>(), loss_share = std::move(loss_share), tokens] {
      out[0] = float(loss_share());
      out[1] = float(tokens);
    };
    add = [in = stacked.as<const float>(), out = sum.as<float>(), microbatches] {
      out[0] = out[1] = 0;
      for (int m = 0; m < microbatches; ++m) {
        out[0] += in[2 * m];
        out[1] += in[2 * m + 1];
      }
    };
  }
  s.launch({"loss_reduce.vstack", small(2.0 * stacked.bytes()), std::move(stack), {stacked}});
  s.launch({"loss_reduce.sum",
            small(double(stacked.bytes() + sum.bytes())),
            std::move(add),
            {stacked, sum}});
  dp_cp->all_reduce(sum, sum, 2, s, {.name = "loss_allreduce"});
  s.launch({"loss_reduce.div", small(3.0 * sizeof(float)), {}, {sum}});
}

}  // namespace nodeemu::emu
