// `nodeemu comm`: one collective priced on the emulated fabric, size by size, as nccl-tests
// prints it (size, count, time, algbw, busbw), and with --fit the fabric's figures fitted to the
// public nccl-tests points (emu/fabric_fit.hpp) with each point's leave-one-out error.
//
// The sweep runs the collective on the engine in meta mode, as a training run issues it: every
// member's host issues it on its default stream, a warm-up call and then --iters calls back to
// back, timed between two events as nccl-tests times them.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <iomanip>
#include <map>
#include <memory>
#include <ostream>
#include <sstream>

#include "comm/communicator.hpp"
#include "comm/flex_dispatcher.hpp"
#include "devices/errors.hpp"
#include "devices/node.hpp"
#include "emu/detail/commands.hpp"
#include "emu/detail/node_args.hpp"
#include "emu/fabric_fit.hpp"

namespace nodeemu::emu {

namespace {

const std::map<std::string, Collective>& collectives() {
  static const std::map<std::string, Collective> c = {
      {"all_to_all", Collective::AllToAll},          {"all_gather", Collective::AllGather},
      {"reduce_scatter", Collective::ReduceScatter}, {"all_reduce", Collective::AllReduce},
      {"broadcast", Collective::Broadcast},          {"send_recv", Collective::SendRecv}};
  return c;
}

struct CommArgs {
  detail::NodeArgs node;
  std::string collective;
  int gpus = 0;  // 0: every GPU of the nodes
  std::string min_bytes = "8", max_bytes = "128M";
  double factor = 2;
  int iters = 5;
  std::string fit;
  bool errors = false;
  // dispatch and combine: DeepEP's and HybridEP's benchmark (tests/test_intranode.py: 4096 tokens
  // of hidden 7168, top-8 of 256 experts, bf16 rows).
  std::string backend = "deepep";
  int tokens = 4096, hidden = 7168, topk = 8, experts = 256, sms = 0;
};

// "8", "64K", "128M", "8G": bytes, binary multiples as nccl-tests reads -b and -e.
std::size_t parse_size(const std::string& text, const char* option) {
  std::size_t used = 0;
  double v = -1;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
  }
  double unit = 1;
  if (used + 1 == text.size()) {
    const char u = static_cast<char>(std::toupper(static_cast<unsigned char>(text.back())));
    unit = u == 'K' ? 1024.0 : u == 'M' ? 1048576.0 : u == 'G' ? 1073741824.0 : 0;
  } else if (used != text.size()) {
    unit = 0;
  }
  if (v <= 0 || unit == 0)
    throw ConfigError(
        "nodeemu comm", option,
        "'" + text + "' is not a size; use bytes with an optional K, M or G (8, 64K, 128M)");
  return static_cast<std::size_t>(v * unit);
}

struct Row {
  std::size_t bytes = 0;
  double time_s = 0;
};

// What each member sends and receives for a collective of nccl-tests size `bytes` on n members.
struct Sizes {
  std::size_t send = 0, recv = 0;
};
Sizes buffer_sizes(Collective c, std::size_t bytes, int n) {
  const std::size_t piece = bytes / std::size_t(n);
  switch (c) {
    case Collective::AllGather:
      return {piece, bytes};
    case Collective::ReduceScatter:
      return {bytes, piece};
    default:
      return {bytes, bytes};
  }
}

// nccl-tests' sizes rounded so that every member's piece is whole fp32 elements.
std::size_t rounded(Collective c, std::size_t bytes, int n) {
  const std::size_t quantum =
      (c == Collective::AllReduce || c == Collective::Broadcast || c == Collective::SendRecv)
          ? 4
          : 4 * std::size_t(n);
  return std::max(quantum, bytes / quantum * quantum);
}

void issue(Collective c, Group& g, int me, const Buffer& send, const Buffer& recv,
           std::size_t bytes, Stream& s) {
  const int n = g.size();
  const CollOptions async{.async = true};
  switch (c) {
    case Collective::AllToAll:
      g.all_to_all(send, recv, bytes / std::size_t(n), s, async);
      break;
    case Collective::AllGather:
      g.all_gather(send, recv, bytes / std::size_t(n), s, async);
      break;
    case Collective::ReduceScatter:
      g.reduce_scatter(send, recv, std::vector<std::size_t>(size_t(n), bytes / 4 / std::size_t(n)),
                       s, async);
      break;
    case Collective::AllReduce:
      g.all_reduce(send, recv, bytes / 4, s, async);
      break;
    case Collective::Broadcast:
      g.broadcast(send, bytes, 0, s, async);
      break;
    case Collective::SendRecv:
      // Members pair with the member half the group away: across nodes when the group spans two.
      g.send_recv((me + n / 2) % n, send, bytes, recv, bytes, s, async);
      break;
  }
}

int sweep(const CommArgs& a, std::ostream& out, std::ostream& err) {
  const auto found = collectives().find(a.collective);
  if (found == collectives().end()) {
    std::string names;
    for (const auto& [name, c] : collectives()) names += (names.empty() ? "" : ", ") + name;
    throw ConfigError("nodeemu comm", "COLLECTIVE",
                      "'" + a.collective + "' is not a collective; use one of " + names +
                          ", dispatch or combine");
  }
  const Collective coll = found->second;
  NodeOptions options = a.node.options();
  options.mode = Mode::Meta;
  Node node(std::move(options));
  Communicator comm(node);
  const NodeTopology& topo = node.topology();
  const int nodes = node.options().nodes, all = node.device_count();
  const int n = a.gpus == 0 ? all : a.gpus;
  if (n < 1 || n > all || n % nodes != 0 || (coll == Collective::SendRecv && n % 2 != 0))
    throw ConfigError("nodeemu comm", "--gpus",
                      std::to_string(n) + " GPUs do not spread evenly over " +
                          std::to_string(nodes) + " node(s) of " + std::to_string(topo.gpus) +
                          "; use a multiple of --nodes up to " + std::to_string(all) +
                          (coll == Collective::SendRecv ? ", even for send_recv" : ""));
  if (a.iters < 1) throw ConfigError("nodeemu comm", "--iters", "use at least 1");
  if (a.factor <= 1) throw ConfigError("nodeemu comm", "--step-factor", "use a factor above 1");
  // The first n / nodes GPUs of every node.
  std::vector<int> ranks;
  for (int node_i = 0; node_i < nodes; ++node_i)
    for (int i = 0; i < n / nodes; ++i) ranks.push_back(node_i * topo.gpus + i);
  const std::size_t lo = parse_size(a.min_bytes, "--min-bytes"),
                    hi = parse_size(a.max_bytes, "--max-bytes");
  if (hi < lo) throw ConfigError("nodeemu comm", "--max-bytes", "is below --min-bytes");
  std::vector<Row> rows;
  for (double b = double(lo); b <= double(hi) * (1 + 1e-9); b *= a.factor) {
    const std::size_t r = rounded(coll, static_cast<std::size_t>(b), n);
    if (rows.empty() || rows.back().bytes != r) rows.push_back({r, 0});
  }
  const Fabric& fabric = comm.fabric();
  const GroupShape shape = fabric.shape(ranks);
  const CollAlgorithm algorithm = default_algorithm(coll, shape, fabric.figures());
  err << "comm: " << to_string(coll) << " on " << n << " GPUs, " << rows.size() << " sizes\n";

  node.run([&](Host& host) {
    const auto at = std::find(ranks.begin(), ranks.end(), host.rank());
    if (at == ranks.end()) return;
    const int me = static_cast<int>(at - ranks.begin());
    Group g = comm.group(ranks, "comm");
    Stream s = host.device().default_stream();
    for (Row& row : rows) {
      const Sizes sz = buffer_sizes(coll, row.bytes, n);
      Buffer send = host.device().allocate(sz.send), recv = host.device().allocate(sz.recv);
      issue(coll, g, me, send, recv, row.bytes, s);  // warm-up
      Event start, end;
      s.record(start);
      for (int i = 0; i < a.iters; ++i) issue(coll, g, me, send, recv, row.bytes, s);
      s.record(end);
      end.synchronize();
      if (me == 0) row.time_s = Event::elapsed_s(start, end) / a.iters;
    }
  });

  out << "# nodeemu comm " << to_string(coll) << ": " << n << " GPUs, " << n / nodes
      << " on each of " << nodes << " node(s) of " << topo.name << "; algorithm "
      << to_string(algorithm) << " (NCCL's default here)\n"
      << "#" << std::setw(13) << "size" << std::setw(14) << "count" << std::setw(7) << "type"
      << std::setw(12) << "time" << std::setw(9) << "algbw" << std::setw(9) << "busbw"
      << "\n"
      << "#" << std::setw(13) << "(B)" << std::setw(14) << "(elements)" << std::setw(7) << ""
      << std::setw(12) << "(us)" << std::setw(9) << "(GB/s)" << std::setw(9) << "(GB/s)"
      << "\n";
  const double factor = bus_factor(coll, n);
  for (const Row& row : rows) {
    const std::size_t count = buffer_sizes(coll, row.bytes, n).send / 4;
    const double algbw = double(row.bytes) / row.time_s / 1e9;
    out << std::setw(14) << row.bytes << std::setw(14) << count << std::setw(7) << "float"
        << std::fixed << std::setprecision(2) << std::setw(12) << row.time_s * 1e6 << std::setw(9)
        << algbw << std::setw(9) << algbw * factor << "\n"
        << std::defaultfloat;
  }
  return 0;
}

// The flex dispatcher's dispatch or combine, every member's tokens spread evenly over every
// expert (meta mode's counts), timed as the collectives are. Prints the time and the bandwidth
// DeepEP's tables print: NVLink bytes over time inside a node, RDMA bytes over time across.
int flex(const CommArgs& a, bool combine, std::ostream& out, std::ostream& err) {
  if (a.backend != "deepep" && a.backend != "hybridep")
    throw ConfigError("nodeemu comm", "--backend",
                      "'" + a.backend + "' is not a flex backend; use deepep or hybridep");
  if (a.tokens < 1 || a.hidden < 1 || a.topk < 1 || a.experts < a.topk)
    throw ConfigError("nodeemu comm", "--tokens",
                      "tokens, hidden and topk must be positive and topk at most --experts");
  NodeOptions options = a.node.options();
  options.mode = Mode::Meta;
  Node node(std::move(options));
  Communicator comm(node);
  const int n = a.gpus == 0 ? node.device_count() : a.gpus, nodes = node.options().nodes;
  if (n < 1 || n > node.device_count() || n % nodes != 0 || a.experts % n != 0)
    throw ConfigError("nodeemu comm", "--gpus",
                      std::to_string(n) + " GPUs must spread evenly over the nodes and divide " +
                          std::to_string(a.experts) + " experts");
  std::vector<int> ranks;
  for (int node_i = 0; node_i < nodes; ++node_i)
    for (int i = 0; i < n / nodes; ++i) ranks.push_back(node_i * node.topology().gpus + i);
  const FlexConfig config{
      .backend = a.backend == "deepep" ? FlexBackend::DeepEP : FlexBackend::HybridEP,
      .num_sms = a.sms,
      .rows = {.elem_bytes = 2,
               .widen = [](const void*, float*, std::size_t) {},
               .narrow = [](const float*, void*, std::size_t) {}}};
  const std::vector<std::int64_t> counts(size_t(n) * size_t(a.experts),
                                         std::int64_t(a.tokens) * a.topk / a.experts);
  const std::vector<std::int64_t> tokens(size_t(n), a.tokens);
  double seconds = 0;
  FlexTraffic traffic;
  int sms = 0;
  err << "comm: " << a.backend << (combine ? " combine" : " dispatch") << " on " << n << " GPUs\n";
  node.run([&](Host& host) {
    const auto at = std::find(ranks.begin(), ranks.end(), host.rank());
    if (at == ranks.end()) return;
    Group ep = comm.group(ranks, "ep");
    FlexDispatcher disp(ep, a.experts, a.hidden, a.topk, config);
    Device& dev = host.device();
    Stream s = dev.default_stream();
    const std::size_t T = std::size_t(a.tokens);
    Buffer x = dev.allocate(T * disp.row_bytes()), idx = dev.allocate(T * size_t(a.topk) * 8),
           w = dev.allocate(T * size_t(a.topk) * 4);
    Event start, end;
    s.record(start);
    FlexDispatched d = disp.dispatch(x, idx, w, a.tokens, s, {}, counts, tokens);
    const FlexTraffic before = disp.traffic();
    if (combine) {
      s.record(start);
      disp.combine(d.x, d.handle, s);
    }
    s.record(end);
    end.synchronize();
    if (at == ranks.begin()) {
      seconds = Event::elapsed_s(start, end);
      traffic = disp.traffic();
      if (combine) {  // the combine's own bytes
        traffic.nvlink_bytes -= before.nvlink_bytes;
        traffic.rdma_bytes -= before.rdma_bytes;
      }
      sms = disp.num_sms();
    }
  });
  const bool across = nodes > 1;
  const double bytes = double(across ? traffic.rdma_bytes : traffic.nvlink_bytes);
  out << "# nodeemu comm " << (combine ? "combine" : "dispatch") << " (" << a.backend << ", " << sms
      << " SMs): " << n << " GPUs on " << nodes << " node(s) of " << node.topology().name << ", "
      << a.tokens << " tokens of hidden " << a.hidden << " (bf16), top-" << a.topk << " of "
      << a.experts << " experts, spread evenly\n"
      << "#" << std::setw(11) << "time" << std::setw(14) << (across ? "rdma" : "nvlink")
      << std::setw(12) << "bandwidth\n"
      << "#" << std::setw(11) << "(us)" << std::setw(14) << "(MB)" << std::setw(11) << "(GB/s)"
      << "\n"
      << std::fixed << std::setprecision(2) << std::setw(12) << seconds * 1e6 << std::setw(14)
      << bytes / 1e6 << std::setw(11) << bytes / seconds / 1e9 << "\n"
      << std::defaultfloat;
  return 0;
}

std::string percent(double x) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(1) << 100 * x << " %";
  return s.str();
}

int fit(const CommArgs& a, std::ostream& out) {
  const std::vector<PublicPoint> points = read_public_points(a.fit);
  NodeOptions options = a.node.options();
  const NodeTopology topo =
      options.topology ? *options.topology : NodeTopology::from_file(options.topology_path);
  const FabricFit f = fit_fabric(points, FabricFigures::of(topo), topo.gpus, topo.nic.per_node);
  std::map<std::string, int> left;
  for (const PublicPoint& p : points)
    if (!p.left_out.empty()) ++left[p.left_out];
  out << "fabric fit of " << topo.name << ": " << f.fitted.size() << " of " << points.size()
      << " points of " << a.fit << "\n";
  for (const auto& [why, count] : left) out << "  left out " << count << ": " << why << "\n";
  const FabricFigures& g = f.figures;
  out << std::setprecision(4) << "fitted (the topology's keys):\n"
      << "  nvlink: {efficiency: " << g.nvlink.efficiency
      << ", nvls_efficiency: " << g.nvlink.nvls_efficiency << "}\n"
      << "  nic: {efficiency: " << g.nic.efficiency << "}\n"
      << "  protocols:\n";
  for (const ProtocolSpec& p : g.protocols)
    out << "    " << p.name << ": {base_latency_us: " << p.base_latency_s * 1e6
        << ", bandwidth_share: " << p.bandwidth_share << ", nic_step_us: " << p.nic_step_s * 1e6
        << "}\n";
  out << std::defaultfloat;
  // By source and collective: how many points, the median error of the fit and left-one-out.
  struct Group {
    std::vector<double> err, loo;
  };
  std::map<std::string, Group> by;
  for (size_t i = 0; i < f.fitted.size(); ++i) {
    const PublicPoint& p = *f.fitted[i];
    const std::string key = run_of(p);
    by[key].err.push_back(f.errors[i].fitted_s / p.time_s - 1);
    by[key].loo.push_back(f.errors[i].loo_s / p.time_s - 1);
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  };
  out << "signed median error (time, fitted / left-one-out), by run:\n";
  for (const auto& [key, grp] : by)
    out << "  " << std::setw(3) << grp.err.size() << "  " << std::setw(8)
        << percent(median(grp.err)) << "  " << std::setw(8) << percent(median(grp.loo)) << "  "
        << key << "\n";
  out << "leave-one-out |error|: median " << percent(f.median_abs_loo_error) << ", p90 "
      << percent(f.p90_abs_loo_error) << " (fitted: median " << percent(f.median_abs_error)
      << ")\n";
  if (a.errors) {
    out << "collective,gpus,nodes,bytes,algorithm,measured_us,fitted_us,loo_us,source\n";
    for (size_t i = 0; i < f.fitted.size(); ++i) {
      const PublicPoint& p = *f.fitted[i];
      const GroupShape s = GroupShape::even(p.gpus, p.nodes, topo.gpus, topo.nic.per_node);
      out << to_string(p.collective) << "," << p.gpus << "," << p.nodes << "," << p.bytes << ","
          << to_string(p.forced.value_or(default_algorithm(p.collective, s, f.figures))) << ","
          << p.time_s * 1e6 << "," << f.errors[i].fitted_s * 1e6 << "," << f.errors[i].loo_s * 1e6
          << ",\"" << p.source << "\"\n";
    }
  }
  return 0;
}

}  // namespace

namespace detail {

CommandBody add_comm(CLI::App& app, Streams io) {
  auto a = std::make_shared<CommArgs>();
  app.add_option("collective", a->collective,
                 "all_to_all, all_gather, reduce_scatter, all_reduce, broadcast, send_recv, or "
                 "the flex dispatcher's dispatch or combine")
      ->type_name("COLLECTIVE");
  a->node.add_to(app);
  app.add_option("--gpus", a->gpus, "GPUs in the group, spread evenly over the nodes (0: all)")
      ->capture_default_str();
  app.add_option("-b,--min-bytes", a->min_bytes, "smallest size (nccl-tests' -b)")
      ->capture_default_str();
  app.add_option("-e,--max-bytes", a->max_bytes, "largest size (nccl-tests' -e)")
      ->capture_default_str();
  app.add_option("-f,--step-factor", a->factor, "size multiplier between rows (nccl-tests' -f)")
      ->capture_default_str();
  app.add_option("--iters", a->iters, "timed calls per size, after one warm-up")
      ->capture_default_str();
  app.add_option("--fit", a->fit,
                 "fit the topology's fabric figures to a public nccl-tests table and print each "
                 "point's leave-one-out error instead")
      ->type_name("CSV");
  app.add_flag("--errors", a->errors, "with --fit: every point's times, as CSV");
  app.add_option("--backend", a->backend, "dispatch and combine: deepep or hybridep")
      ->capture_default_str();
  app.add_option("--tokens", a->tokens, "dispatch and combine: tokens per GPU")
      ->capture_default_str();
  app.add_option("--hidden", a->hidden, "dispatch and combine: hidden size")->capture_default_str();
  app.add_option("--topk", a->topk, "dispatch and combine: experts per token")
      ->capture_default_str();
  app.add_option("--experts", a->experts, "dispatch and combine: experts in all")
      ->capture_default_str();
  app.add_option("--sms", a->sms,
                 "dispatch and combine: the kernels' SMs (0: the backend's default)")
      ->capture_default_str();
  return [a, io] {
    if (!a->fit.empty()) return fit(*a, io.out);
    if (a->collective.empty())
      throw ConfigError("nodeemu comm", "COLLECTIVE",
                        "missing; name a collective such as all_reduce, or give --fit CSV");
    if (a->collective == "dispatch" || a->collective == "combine")
      return flex(*a, a->collective == "combine", io.out, io.err);
    return sweep(*a, io.out, io.err);
  };
}

}  // namespace detail

}  // namespace nodeemu::emu
