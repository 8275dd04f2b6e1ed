#include "devices/stream.hpp"

#include <cstring>

#include "devices/cost_model.hpp"
#include "devices/detail/buffer_state.hpp"
#include "devices/detail/node_impl.hpp"
#include "devices/detail/price_book.hpp"
#include "devices/device.hpp"
#include "devices/errors.hpp"
#include "devices/host.hpp"
#include "devices/node.hpp"

namespace nodeemu {

namespace {

std::vector<std::shared_ptr<detail::BufferState>> states_of(const std::vector<Buffer>& bufs) {
  std::vector<std::shared_ptr<detail::BufferState>> out;
  out.reserve(bufs.size());
  for (const auto& b : bufs) {
    if (!b) throw UsageError("launch: Kernel::uses holds an empty Buffer");
    out.push_back(b.state()->shared_from_this());
  }
  return out;
}

}  // namespace

OpClass op_class(const KernelShape& s) {
  switch (s.kind) {
    case KernelKind::Gemm:
    case KernelKind::GroupedGemm:
      return OpClass::Gemm;
    case KernelKind::Attention:
      return OpClass::Attention;
    case KernelKind::MemoryBound:
      return s.op == MemoryOp::Gather || s.op == MemoryOp::Scatter || s.op == MemoryOp::ScatterAdd
                 ? OpClass::Permute
             : s.op == MemoryOp::Copy ? OpClass::Memcpy
                                      : OpClass::Elementwise;
    case KernelKind::Unspecified:
      break;
  }
  return OpClass::Other;
}

void Stream::launch(Kernel k) {
  if (!state_) throw UsageError("launch: the Stream handle is empty; get one from a Device");
  Node& node = device_->node();
  detail::Engine& e = detail::NodeAccess::engine(node);
  const GpuSpec& g = device_->spec();
  const double t = node.price_book().seconds(g, k.work, k.name);
  for (const Buffer& b : k.uses)
    if (!b) throw UsageError("launch: Kernel::uses holds an empty Buffer");
  if (e.mode() == Mode::Functional && k.body)
    detail::NodeAccess::functional_kernel_flops(node) += k.work.flops;
  e.launch(*state_, OpKind::Kernel, detail::ResourceKind::Sm, t, k.work.sms, std::move(k.name),
           e.mode() == Mode::Functional ? std::move(k.body) : nullptr, {}, g.kernel_launch_host_s,
           g.launch_latency_s, op_class(k.work.shape), {k.uses.data(), k.uses.size()});
}

void Stream::copy(const Buffer& dst, const Buffer& src, std::size_t bytes, std::string name,
                  std::function<void()> then) {
  if (!state_) throw UsageError("copy: the Stream handle is empty; get one from a Device");
  copy_impl(dst, src, bytes, std::move(name), std::move(then),
            device_->spec().memcpy_launch_host_s);
}

void Stream::read_to_host(const Buffer& dst, const Buffer& src, std::size_t bytes,
                          std::string name) {
  if (!state_) throw UsageError("read_to_host: the Stream handle is empty");
  detail::Engine& e = detail::NodeAccess::engine(device_->node());
  EagerIssue eager(device_->node());
  const std::uint32_t id = copy_impl(dst, src, bytes, std::move(name), {}, 0.0);
  const double copy_s = e.duration_s(id);
  e.host_wait(id, state_->device, state_->last_task,
              std::max(0.0, device_->spec().small_d2h_sync_host_s - copy_s));
}

std::uint32_t Stream::copy_impl(const Buffer& dst, const Buffer& src, std::size_t bytes,
                                std::string name, std::function<void()> then, double host_cost_s) {
  if (!dst || !src) throw UsageError("copy: empty Buffer handle");
  if (bytes == SIZE_MAX) bytes = src.bytes();
  if (bytes > src.bytes() || bytes > dst.bytes())
    throw UsageError("copy: " + std::to_string(bytes) + " bytes do not fit (source " +
                     std::to_string(src.bytes()) + ", destination " + std::to_string(dst.bytes()) +
                     " bytes)");
  const int me = device_->id();
  auto on_me = [&](const Buffer& b) { return b.kind() == MemoryKind::Device && b.device() == me; };
  auto is_host = [](const Buffer& b) { return b.kind() != MemoryKind::Device; };
  CopyDirection dir;
  detail::ResourceKind res;
  const Buffer* host = nullptr;
  if (is_host(src) && on_me(dst)) {
    dir = CopyDirection::HostToDevice, res = detail::ResourceKind::H2D, host = &src;
  } else if (on_me(src) && is_host(dst)) {
    dir = CopyDirection::DeviceToHost, res = detail::ResourceKind::D2H, host = &dst;
  } else if (on_me(src) && on_me(dst)) {
    dir = CopyDirection::DeviceToDevice, res = detail::ResourceKind::D2D;
  } else {
    throw UsageError("copy: on " + device_->name() +
                     " a copy must have this device's memory on one side and host or this "
                     "device's memory on the other; copies between GPUs go through comm/");
  }
  bool pageable = host && host->kind() == MemoryKind::PageableHost;
  bool remote = false;
  if (host) {
    const auto& topo = device_->node().topology();
    int host_socket = topo.host.numa_socket[static_cast<size_t>(host->numa())];
    remote = host_socket != device_->placement().emulated_socket;
  }
  const auto& topo = device_->node().topology();
  double t =
      copy_seconds(device_->spec(), topo.pcie, dir, static_cast<double>(bytes), pageable, remote);
  detail::Engine& e = detail::NodeAccess::engine(device_->node());
  std::function<void()> body;
  if (e.mode() == Mode::Functional && bytes > 0) {
    void* d = dst.data();
    const void* s = src.data();
    body = [d, s, bytes, then = std::move(then)] {
      std::memmove(d, s, bytes);  // a D2D copy may overlap itself
      if (then) then();
    };
  }
  if (name.empty()) {
    name = dir == CopyDirection::HostToDevice   ? "memcpy H2D"
           : dir == CopyDirection::DeviceToHost ? "memcpy D2H"
                                                : "memcpy D2D";
  }
  return e.launch(*state_, OpKind::Copy, res, t, 0, std::move(name), std::move(body),
                  states_of({dst, src}), host_cost_s, 0.0, OpClass::Memcpy);
}

void Stream::record(Event& ev) {
  if (!state_) throw UsageError("record: the Stream handle is empty; get one from a Device");
  detail::NodeAccess::engine(device_->node()).record(*state_, ev.state());
}

void Stream::wait(const Event& ev) {
  if (!state_) throw UsageError("wait: the Stream handle is empty; get one from a Device");
  detail::NodeAccess::engine(device_->node()).wait(*state_, ev.state());
}

void Stream::synchronize() {
  if (!state_) throw UsageError("synchronize: the Stream handle is empty");
  detail::Engine& e = detail::NodeAccess::engine(device_->node());
  e.host_wait(state_->last, state_->device, state_->last_task);
}

bool Stream::query() {
  if (!state_) throw UsageError("query: the Stream handle is empty");
  return detail::NodeAccess::engine(device_->node())
      .host_query(state_->last, state_->device, state_->last_task);
}

Priority Stream::priority() const {
  return state_->priority;
}
const std::string& Stream::name() const {
  return state_->name;
}
int Stream::index() const {
  return state_->index;
}

}  // namespace nodeemu
