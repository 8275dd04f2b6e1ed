#include "devices/node.hpp"

#include <cstdio>
#include <fstream>

#include "devices/detail/buffer_state.hpp"
#include "devices/detail/node_impl.hpp"
#include "devices/errors.hpp"

namespace nodeemu {

namespace {

std::shared_ptr<const NodeTopology> load_topology(const NodeOptions& o) {
  if (o.topology) return o.topology;
  if (o.topology_path.empty())
    throw ConfigError("<options>", "topology",
                      "no topology given; pass a file such as configs/topologies/dgx_h100.yaml");
  return std::make_shared<const NodeTopology>(NodeTopology::from_file(o.topology_path));
}

void check_options(const NodeOptions& o, const NodeTopology& t) {
  const std::string src = t.file;
  if (o.nodes < 1 || o.nodes > kMaxNodes)
    throw ConfigError(
        src, "nodes",
        "must be between 1 and " + std::to_string(kMaxNodes) + ", got " + std::to_string(o.nodes));
  if (o.cuda_device_max_connections < 1 || o.cuda_device_max_connections > 32)
    throw ConfigError(src, "cuda_device_max_connections",
                      "must be between 1 and 32 (CUDA's range), got " +
                          std::to_string(o.cuda_device_max_connections));
  if (o.thread_budget < 0)
    throw ConfigError(src, "thread_budget", "must be >= 0 (0 = the hardware threads)");
  const int devices = o.nodes * t.gpus;
  for (int d : o.trace_devices)
    if (d < 0 || d >= devices)
      throw ConfigError("<options>", "trace_devices",
                        "GPU " + std::to_string(d) + " does not exist; the run has " +
                            std::to_string(devices) + " (0-" + std::to_string(devices - 1) + ")");
  if (o.workers_per_device < 0 || o.workers_per_device > 256)
    throw ConfigError(src, "workers_per_device", "must be between 0 (automatic) and 256");
  if (!(o.collective_timeout_s == 0 ||
        o.collective_timeout_s >= NodeOptions::kMinCollectiveTimeoutS))
    throw ConfigError(src, "collective_timeout_s",
                      "must be 0 (no watchdog) or at least " +
                          std::to_string(int(NodeOptions::kMinCollectiveTimeoutS)) +
                          " s: a shorter wait for a slow peer on a loaded host is not a hang");
}

}  // namespace

Node::Node(NodeOptions options) : impl_(std::make_unique<detail::NodeImpl>()) {
  auto& m = *impl_;
  // Decide the GEMM kernel before anything can call BLAS.
  blas::ensure_kernel();
  m.topology = load_topology(options);
  check_options(options, *m.topology);
  m.options = std::move(options);
  m.host = m.options.synthetic_host.empty() ? HostTopology::real()
                                            : HostTopology::synthetic(m.options.synthetic_host);
  int budget = m.options.thread_budget > 0 ? m.options.thread_budget : default_thread_budget();
  m.placements = place_devices(*m.topology, m.options.nodes, m.host, budget,
                               m.options.workers_per_device, m.options.bindpcie);
  m.budget = std::make_unique<ExecutionBudget>(budget);
  m.engine =
      std::make_shared<detail::Engine>(m.options.mode, m.options.cuda_device_max_connections);
  if (m.options.record_trace) {
    if (!m.options.trace_devices.empty())
      m.recorder.keep_only(m.options.trace_devices, &m.engine->layout());
    m.engine->add_observer(&m.recorder);
  }
  m.engine->set_hang_timeout(m.options.collective_timeout_s);
  for (const auto& p : m.placements) {
    std::string name = "node " + std::to_string(p.node) + " GPU " + std::to_string(p.local);
    WorkerPool& pool = m.pools.emplace_back(name, p.workers, p.real_pus, *m.budget);
    const GpuSpec* spec = &m.topology->gpu;
    m.engine->add_device(spec, &pool, name + " (" + spec->name + ")");
    m.devices.emplace_back(this, p, spec, &pool);
  }
}

Node::~Node() = default;

const NodeOptions& Node::options() const {
  return impl_->options;
}
const NodeTopology& Node::topology() const {
  return *impl_->topology;
}
const HostTopology& Node::host_topology() const {
  return impl_->host;
}
const blas::KernelChoice& Node::blas_kernel() const {
  return blas::ensure_kernel();
}
Mode Node::mode() const {
  return impl_->options.mode;
}
int Node::device_count() const {
  return static_cast<int>(impl_->devices.size());
}
ExecutionBudget& Node::budget() {
  return *impl_->budget;
}
const TimelineLayout& Node::timeline_layout() const {
  return impl_->engine->layout();
}

Device& Node::device(int id) {
  if (id < 0 || id >= device_count())
    throw UsageError("node: no device " + std::to_string(id) + "; this node has devices 0.." +
                     std::to_string(device_count() - 1));
  return impl_->devices[static_cast<size_t>(id)];
}

void Node::run(const std::function<void(Host&)>& program) {
  std::vector<int> ranks(static_cast<size_t>(device_count()));
  for (int i = 0; i < device_count(); ++i) ranks[static_cast<size_t>(i)] = i;
  run(ranks, program);
}

void Node::run(const std::vector<int>& ranks, const std::function<void(Host&)>& program) {
  std::vector<std::function<void()>> bodies;
  std::vector<std::string> names;
  std::vector<std::vector<int>> cpus;
  for (int r : ranks) {
    // bindpcie: the rank's host program runs on its GPU's PCIe-local cores (the engine binds
    // the thread whenever it hands the baton to this rank).
    cpus.push_back(device(r).placement().process_real_pus);  // device() validates r
    bodies.emplace_back([this, &program] {
      Host h(*this);
      program(h);
    });
    names.push_back("rank " + std::to_string(r));
  }
  impl_->engine->run_actors(bodies, names, ranks, cpus);
}

Buffer Node::allocate_host(std::size_t bytes, int numa_node, bool pinned, int node) {
  const auto& t = *impl_->topology;
  if (numa_node < 0 || numa_node >= t.host.numa_count())
    throw UsageError("allocate_host: emulated NUMA node " + std::to_string(numa_node) +
                     " does not exist; " + t.name + " has nodes 0.." +
                     std::to_string(t.host.numa_count() - 1));
  if (node < 0 || node >= impl_->options.nodes)
    throw UsageError("allocate_host: emulated node " + std::to_string(node) + " does not exist");
  auto s = std::make_shared<detail::BufferState>();
  s->kind = pinned ? MemoryKind::PinnedHost : MemoryKind::PageableHost;
  s->numa = numa_node;
  s->bytes = bytes;
  s->meta = mode() == Mode::Meta;
  if (!s->meta) {
    int host_numa = (node * t.host.numa_count() + numa_node) % impl_->host.numa_count();
    int real = impl_->host.numa(host_numa).real_os_index;
    s->placement =
        pinned ? numa::allocate_pinned_on_node(bytes, real) : numa::allocate_on_node(bytes, real);
  }
  s->engine = impl_->engine;
  return detail::first_handle(std::move(s));
}

void Node::add_observer(TimelineObserver* o) {
  impl_->engine->add_observer(o);
}
std::uint64_t Node::timeline_hash() const {
  return impl_->engine->hasher().value();
}
std::uint64_t Node::timeline_records() const {
  return impl_->engine->hasher().count();
}
const TraceRecorder& Node::trace() const {
  return impl_->recorder;
}
detail::PriceBook& Node::price_book() {
  return impl_->prices;
}

std::vector<std::string> Node::unpriced_kernels() const {
  std::vector<std::string> out;
  for (const auto& [name, what] : impl_->prices.unpriced()) out.push_back(name + " (" + what + ")");
  return out;
}

std::uint64_t Node::engine_ops() const {
  return impl_->engine->ops_issued();
}

double Node::functional_kernel_flops() const {
  return impl_->functional_kernel_flops;
}

int Node::host_device(int host) const {
  return impl_->engine->layout().host_device.at(std::size_t(host));
}

void Node::write_chrome_trace(std::ostream& os) const {
  impl_->recorder.write_chrome_json(os, impl_->engine->layout());
}

void Node::write_chrome_trace(const std::string& path) const {
  std::string tmp = path + ".partial";
  {
    std::ofstream f(tmp);
    if (!f) throw UsageError("trace: cannot write '" + path + "'; check the directory exists");
    write_chrome_trace(f);
    if (!f.flush()) {
      std::remove(tmp.c_str());
      throw UsageError("trace: writing '" + path + "' failed (disk full?)");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw UsageError("trace: cannot move the trace into '" + path + "'");
  }
}

// ------------------------------------------------------------------------- Device

Device::Device(Node* node, DevicePlacement placement, const GpuSpec* spec, WorkerPool* pool)
    : node_(node), placement_(std::move(placement)), spec_(spec), pool_(pool) {
  streams_.emplace_back(
      this, detail::NodeAccess::engine(*node_).create_stream(id(), Priority::Normal, "default"));
}

std::string Device::name() const {
  return detail::NodeAccess::engine(*node_).layout().device_names[size_t(id())];
}

Stream Device::create_stream(Priority p, std::string name) {
  return streams_.emplace_back(
      this, detail::NodeAccess::engine(*node_).create_stream(id(), p, std::move(name)));
}

Stream Device::shared_stream(const std::string& name, Priority p) {
  for (const Stream& s : streams_)
    if (s.name() == name) return s;
  return create_stream(p, name);
}

Buffer Device::allocate(std::size_t bytes, std::vector<std::int64_t> shape) {
  return allocate_impl(bytes, std::move(shape), true, false, nullptr);
}

Buffer Device::allocate_uninitialized(std::size_t bytes, std::vector<std::int64_t> shape,
                                      const Stream* pool_stream) {
  return allocate_impl(bytes, std::move(shape), false, false, pool_stream);
}

Buffer Device::reserve(std::size_t bytes) {
  return allocate_impl(bytes, {}, false, true, nullptr);
}

Buffer Device::workspace(std::size_t bytes) {
  return allocate_impl(bytes, {}, true, false, nullptr, false);
}

Buffer Device::allocate_impl(std::size_t bytes, std::vector<std::int64_t> shape, bool zeroed,
                             bool meta, const Stream* pool_stream, bool accounted) {
  auto& engine = detail::NodeAccess::engine(*node_);
  if (accounted) engine.account_alloc(id(), bytes);
  auto s = std::make_shared<detail::BufferState>();
  s->kind = MemoryKind::Device;
  s->device = id();
  s->numa = placement_.emulated_numa;
  s->bytes = bytes;
  s->accounted = accounted;
  s->shape = std::move(shape);
  if (pool_stream) s->pool_track = pool_stream->state()->track;
  s->meta = meta || engine.mode() == Mode::Meta;
  if (!s->meta) {
    try {
      s->placement = numa::allocate_on_node(bytes, placement_.real_numa, zeroed);
    } catch (...) {
      if (accounted) engine.account_free(id(), bytes, {});
      throw;
    }
  }
  s->engine = detail::NodeAccess::engine_ptr(*node_);
  return detail::first_handle(std::move(s));
}

Buffer Device::allocate_host(std::size_t bytes, bool pinned) {
  return node_->allocate_host(bytes, placement_.process_numa, pinned, placement_.node);
}

std::uint64_t Device::peak_memory(double from_s, double to_s) const {
  auto vt = [](double s) { return VTime(s * double(kPicosPerSecond)); };
  return detail::NodeAccess::engine(*node_).peak_memory(id(), vt(from_s), vt(to_s));
}

MemoryStats Device::memory() const {
  auto& e = detail::NodeAccess::engine(*node_);
  return {e.memory_in_use(id()), e.peak_memory(id()), spec_->hbm_bytes};
}

void Device::synchronize() {
  // By index: a stream created while this host blocks (shared_stream) must not invalidate us.
  for (std::size_t i = 0; i < streams_.size(); ++i) {
    Stream s = streams_[i];
    s.synchronize();
  }
}

// ------------------------------------------------------------------------- Host

int Host::rank() const {
  return detail::NodeAccess::engine(*node_).current().device;
}
VTime Host::now() const {
  return detail::NodeAccess::engine(*node_).current().clock;
}
GraphReplay::GraphReplay(Node& node) : node_(&node) {
  detail::NodeAccess::engine(*node_).enter_graph_replay();
}
GraphReplay::~GraphReplay() {
  detail::NodeAccess::engine(*node_).leave_graph_replay();
}

FrameworkScope::FrameworkScope(Node& node, FrameworkPass pass)
    : node_(&node), outer_(detail::NodeAccess::engine(node).enter_framework_pass(pass)) {}
FrameworkScope::~FrameworkScope() {
  detail::NodeAccess::engine(*node_).enter_framework_pass(outer_);
}

EagerIssue::EagerIssue(Node& node)
    : node_(&node), depth_(detail::NodeAccess::engine(node).suspend_graph_replay()) {}
EagerIssue::~EagerIssue() {
  detail::NodeAccess::engine(*node_).resume_graph_replay(depth_);
}

void Host::compute(double seconds, const std::string& what) {
  detail::NodeAccess::engine(*node_).host_charge(seconds, what);
}
Device& Host::device() const {
  int r = rank();
  if (r < 0)
    throw UsageError(
        "host: the main program drives no device; use node.device(i), or run the "
        "per-rank program through Node::run");
  return node_->device(r);
}

}  // namespace nodeemu
