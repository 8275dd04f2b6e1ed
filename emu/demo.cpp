// `nodeemu demo`: a small two-stream program on every emulated GPU, shaped like one step of the
// combined 1F1B (attention, a dispatch on the comm stream, an independent backward GEMM that
// hides it, then the experts), with real GEMMs on the functional plane. It prints the virtual
// timeline of GPU 0 and every GPU's finish time.
#include <cblas.h>
#include <CLI/CLI.hpp>

#include <cmath>
#include <iomanip>
#include <memory>
#include <ostream>
#include <sstream>

#include "devices/errors.hpp"
#include "devices/node.hpp"
#include "devices/worker_pool.hpp"
#include "emu/detail/commands.hpp"
#include "emu/detail/node_args.hpp"

namespace nodeemu::emu {

namespace {

// C = A * B for n x n row-major fp32, split into row blocks of a fixed size so that the bits do
// not depend on how many workers share the blocks.
void gemm(const float* a, const float* b, float* c, int n) {
  constexpr int kRows = 64;
  size_t blocks = static_cast<size_t>((n + kRows - 1) / kRows);
  WorkerPool::parallel_for(blocks, [=](size_t blk) {
    int r0 = static_cast<int>(blk) * kRows;
    int rows = std::min(kRows, n - r0);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, n, n, 1.0f,
                a + static_cast<size_t>(r0) * n, n, b, n, 0.0f, c + static_cast<size_t>(r0) * n, n);
  });
}

struct DemoArgs {
  detail::NodeArgs node;
  int size = 256;
  std::string trace;
};

int demo(const DemoArgs& args, std::ostream& out, std::ostream& err) {
  const int n = args.size;
  NodeOptions options = args.node.options();
  options.record_trace = true;  // the timeline printed below comes from the records
  Node node(std::move(options));
  const NodeTopology& topo = node.topology();
  const double gemm_flops = 2.0 * n * n * n;
  const double bytes = 4.0 * n * n;
  // The dispatch moves the activations over NVLink; comm/ will price this properly.
  const double a2a_s =
      topo.nvlink.latency_s + bytes / (topo.nvlink.bytes_per_s * topo.nvlink.efficiency);
  std::vector<double> checksums(static_cast<size_t>(node.device_count()), 0.0);

  err << "demo: " << node.device_count() << " GPUs, " << n << "x" << n
      << " GEMMs, cuda_device_max_connections=" << node.options().cuda_device_max_connections
      << "\n";
  node.run([&](Host& host) {
    Device& gpu = host.device();
    Stream comp = gpu.default_stream();
    Stream comm = gpu.create_stream(Priority::High, "comm");
    const bool functional = node.mode() == Mode::Functional;
    // Pinned input on NUMA node 0: the GPUs on the other socket pay the far-socket PCIe factor.
    Buffer h_in = node.allocate_host(2 * static_cast<size_t>(bytes), 0, true, gpu.node_index());
    Buffer h_out = node.allocate_host(static_cast<size_t>(bytes), 0, true, gpu.node_index());
    if (functional) {
      float* p = h_in.as<float>();
      for (int i = 0; i < 2 * n * n; ++i) p[i] = static_cast<float>((i * 7 + gpu.id()) % 13) / 13.f;
    }
    Buffer x = gpu.allocate(2 * static_cast<size_t>(bytes)),
           y = gpu.allocate(static_cast<size_t>(bytes));
    Buffer z = gpu.allocate(static_cast<size_t>(bytes)),
           w = gpu.allocate(static_cast<size_t>(bytes));
    float *xa = functional ? x.as<float>() : nullptr, *xb = xa ? xa + n * n : nullptr;
    float *py = functional ? y.as<float>() : nullptr, *pz = functional ? z.as<float>() : nullptr;
    float* pw = functional ? w.as<float>() : nullptr;
    const Work gemm_work{.flops = gemm_flops, .bytes = 3 * bytes};

    comp.copy(x, h_in);
    comp.launch({"f.attn", gemm_work, [=] { gemm(xa, xb, py, n); }, {x, y}});
    Event attn_done, dispatched;
    comp.record(attn_done);
    comm.wait(attn_done);
    comm.launch({"f.dispatch",
                 Work{.sms = 20, .fixed_s = a2a_s},
                 [=] { std::copy(py, py + n * n, pz); },
                 {y, z}});
    comm.record(dispatched);
    // Independent of the dispatch: this is what hides it.
    comp.launch({"b.mlp_bwd", gemm_work, [=] { gemm(xb, xa, pw, n); }, {x, w}});
    comp.wait(dispatched);
    comp.launch({"f.mlp", gemm_work, [=] { gemm(pz, pw, py, n); }, {z, w, y}});
    comp.copy(h_out, y);
    host.synchronize(comp);
    if (functional) {
      double s = 0;
      const float* r = h_out.as<float>();
      for (int i = 0; i < n * n; ++i) s += r[i];
      checksums[static_cast<size_t>(gpu.id())] = s;
    }
  });

  const auto& layout = node.timeline_layout();
  auto track_name = [&](int dev, int track) {
    for (auto& t : layout.tracks)
      if (t.device == dev && t.track == track) return t.name;
    return std::string("?");
  };
  out << "Virtual timeline of GPU 0 (" << topo.gpu.name
      << ", cuda_device_max_connections=" << node.options().cuda_device_max_connections << "):\n";
  out << "  " << std::left << std::setw(14) << "op" << std::setw(18) << "track" << std::right
      << std::setw(12) << "start us" << std::setw(12) << "end us"
      << "\n";
  std::vector<VTime> finish(static_cast<size_t>(node.device_count()), 0);
  for (auto& r : node.trace().ops()) {
    finish[static_cast<size_t>(r.device)] = std::max(finish[static_cast<size_t>(r.device)], r.end);
    if (r.device != 0) continue;
    std::ostringstream st, en;
    st << std::fixed << std::setprecision(3) << vtime_to_us(r.start);
    en << std::fixed << std::setprecision(3) << vtime_to_us(r.end);
    std::string name =
        r.kind == OpKind::Kernel || r.kind == OpKind::Copy ? r.name : "(" + r.name + ")";
    out << "  " << std::left << std::setw(14) << name << std::setw(18) << track_name(0, r.track)
        << std::right << std::setw(12) << st.str() << std::setw(12) << en.str() << "\n";
  }
  out << "\n  GPU  last op ends (us)  checksum\n";
  for (int d = 0; d < node.device_count(); ++d) {
    std::ostringstream f;
    f << std::fixed << std::setprecision(3) << vtime_to_us(finish[static_cast<size_t>(d)]);
    out << "  " << std::left << std::setw(5) << d << std::right << std::setw(18) << f.str() << "  "
        << std::setprecision(10) << checksums[static_cast<size_t>(d)] << "\n";
  }
  std::ostringstream hash;
  hash << std::hex << node.timeline_hash();
  out << "\ntimeline hash 0x" << hash.str() << " over " << node.timeline_records() << " records\n";
  if (!args.trace.empty()) {
    node.write_chrome_trace(args.trace);
    out << "trace written to " << args.trace << " (open it in https://ui.perfetto.dev)\n";
  }
  return 0;
}

}  // namespace

detail::CommandBody detail::add_demo(CLI::App& app, Streams io) {
  auto args = std::make_shared<DemoArgs>();
  args->node.add_to(app);
  args->node.add_max_connections(app);
  app.add_option("--size", args->size, "the GEMMs' n (n x n x n)")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app.add_option("--trace", args->trace, "write the Chrome trace here")->type_name("FILE");
  return [args, io] { return demo(*args, io.out, io.err); };
}

}  // namespace nodeemu::emu
