// FlexDispatcher's per-GPU runtime: where its kernels run (DeepEP's own comm stream, or the
// caller's) and the persistent buffers it keeps in device memory (flex_buffers.hpp).
#include <algorithm>

#include "comm/comm_state.hpp"
#include "comm/detail/flex_routing.hpp"
#include "comm/flex_buffers.hpp"
#include "comm/flex_dispatcher.hpp"
#include "devices/node.hpp"

namespace nodeemu {

using detail::FlexRouting;

Stream FlexDispatcher::kernel_stream(Stream& caller) {
  if (config_.backend != FlexBackend::DeepEP) return caller;
  // DeepEP's Buffer owns a comm stream per GPU (shared by every layer); with a previous event
  // it waits for the caller's work first (buffer.py dispatch/combine: previous_event).
  Stream own = caller.device().shared_stream("deepep_comm", Priority::High);
  Event previous;
  caller.record(previous);
  own.wait(previous);
  return own;
}

void FlexDispatcher::rejoin(Stream& caller, Stream& used) {
  if (used.state() == caller.state()) return;
  Event after;  // EventOverlap.current_stream_wait
  used.record(after);
  caller.wait(after);
}

void FlexDispatcher::reserve_buffers(Device& dev, int num_tokens) {
  const int n = ep_.size();
  const FlexRouting nodes = [&] {
    FlexRouting r;
    r.set_nodes(machine_node_of_);
    return r;
  }();
  const int me = ep_.index_of(dev.id());
  int ranks_here = 0;
  for (int m = 0; m < n; ++m) ranks_here += nodes.node_of[size_t(m)] == nodes.node_of[size_t(me)];
  std::uint64_t bytes = 0;
  if (config_.backend == FlexBackend::DeepEP) {
    const int hidden_bytes = hidden_ * int(std::max<std::size_t>(config_.rows.elem_bytes, 2));
    bytes = deepep_nvl_buffer_bytes(hidden_bytes, n, sms_) +
            nvshmem_granules(deepep_rdma_buffer_bytes(hidden_bytes, n, sms_));
  } else {
    bytes = hybridep_buffer_bytes(std::max(num_tokens, config_.max_tokens_per_rank), hidden_,
                                  ranks_here, nodes.nodes(), local_experts_ * ranks_here);
  }
  auto& held = ep_.comm().flex_buffers[{dev.id(), int(config_.backend)}];
  if (bytes <= held.bytes) return;
  held.memory = Buffer();  // the smaller one goes first, as a re-made Buffer frees its own
  // Accounted, never read or written here: the emulated kernels move their bytes through the
  // channels, so a functional run holds no real memory for it.
  held.memory = dev.reserve(std::size_t(bytes));
  held.bytes = bytes;
}

}  // namespace nodeemu
