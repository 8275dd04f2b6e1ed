#include "emu/fabric_fit.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <fstream>
#include <functional>
#include <map>

#include "devices/errors.hpp"

namespace nodeemu::emu {

namespace {

// One line of RFC 4180 CSV (the public tables quote their source and notes cells; no cell spans
// lines). Returns false on an unterminated quote.
bool split_csv(const std::string& line, std::vector<std::string>& cells) {
  cells.assign(1, "");
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char ch = line[i];
    if (quoted) {
      if (ch != '"') {
        cells.back() += ch;
      } else if (i + 1 < line.size() && line[i + 1] == '"') {
        cells.back() += '"';
        ++i;
      } else {
        quoted = false;
      }
    } else if (ch == '"') {
      quoted = true;
    } else if (ch == ',') {
      cells.emplace_back();
    } else if (ch != '\r') {
      cells.back() += ch;
    }
  }
  return !quoted;
}

std::optional<Collective> collective_named(const std::string& s) {
  static const std::map<std::string, Collective> names = {
      {"all_reduce", Collective::AllReduce},
      {"all_gather", Collective::AllGather},
      {"reduce_scatter", Collective::ReduceScatter},
      {"alltoall", Collective::AllToAll},
      {"all_to_all", Collective::AllToAll},
      {"broadcast", Collective::Broadcast},
      {"sendrecv", Collective::SendRecv}};
  const auto it = names.find(s);
  if (it == names.end()) return std::nullopt;
  return it->second;
}

// NCCL_ALGO as the run's settings (the notes) force it.
std::optional<CollAlgorithm> forced_algorithm(const std::string& notes) {
  std::string lower = notes;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  const auto at = lower.find("nccl_algo=");
  if (at == std::string::npos) return std::nullopt;
  const std::string v = lower.substr(at + 10, lower.find_first_of(" ;,)", at + 10) - at - 10);
  if (v == "ring") return CollAlgorithm::Ring;
  if (v == "nvls") return CollAlgorithm::Nvls;
  if (v == "nvlstree") return CollAlgorithm::NvlsTree;
  return std::nullopt;
}

// Why a point is not fitted: the fabrics the shipped topologies model are NVLink/NVSwitch
// inside a node and InfiniBand with one NIC per GPU between nodes.
std::string left_out_why(const std::string& scope, const std::string& notes) {
  if (scope != "intranode_nvlink" && scope != "internode_ib")
    return "another fabric (" + scope + "): no topology of NodeEmu models it";
  if (notes.find("degraded") != std::string::npos ||
      notes.find("misconfigured") != std::string::npos)
    return "a run its reporter or the thread calls degraded or misconfigured";
  return "";
}

}  // namespace

std::vector<PublicPoint> read_public_points(const std::string& path) {
  std::ifstream in(path);
  if (!in)
    throw ConfigError(path, "file",
                      "cannot be read; pass configs/calibration/public_fabric/nccl_tests_h100.csv");
  std::string line;
  std::vector<std::string> header, cells;
  if (!std::getline(in, line) || !split_csv(line, header))
    throw ConfigError(path, "line 1", "no header; the table starts with its column names");
  std::map<std::string, size_t> col;
  for (size_t i = 0; i < header.size(); ++i) col[header[i]] = i;
  for (const char* need : {"collective", "scope", "gpus", "nodes", "bytes", "time_us", "algbw_gbs",
                           "busbw_gbs", "source", "notes"})
    if (!col.count(need))
      throw ConfigError(path, "line 1",
                        std::string("no column '") + need + "'; see the README beside it");
  std::vector<PublicPoint> points;
  for (int number = 2; std::getline(in, line); ++number) {
    if (line.empty()) continue;
    const std::string where = "line " + std::to_string(number);
    if (!split_csv(line, cells) || cells.size() != header.size())
      throw ConfigError(path, where,
                        "has " + std::to_string(cells.size()) + " cells for " +
                            std::to_string(header.size()) + " columns (or an unclosed quote)");
    auto cell = [&](const char* name) { return cells[col.at(name)]; };
    auto number_in = [&](const char* name) {
      const std::string v = cell(name);
      if (v.empty()) return 0.0;
      try {
        size_t used = 0;
        const double x = std::stod(v, &used);
        if (used == v.size() && std::isfinite(x) && x >= 0) return x;
      } catch (const std::exception&) {
      }
      throw ConfigError(path, where + ", column " + name,
                        "'" + v + "' is not a non-negative number");
    };
    PublicPoint p;
    const auto c = collective_named(cell("collective"));
    if (!c)
      throw ConfigError(path, where + ", column collective",
                        "'" + cell("collective") +
                            "' is none of all_reduce, all_gather, reduce_scatter, alltoall, "
                            "broadcast, sendrecv");
    p.collective = *c;
    p.scope = cell("scope");
    p.gpus = static_cast<int>(number_in("gpus"));
    p.nodes = static_cast<int>(number_in("nodes"));
    p.bytes = number_in("bytes");
    if (p.gpus < 1 || p.nodes < 1 || p.gpus % p.nodes != 0 || p.bytes <= 0)
      throw ConfigError(path, where,
                        "needs whole nodes of GPUs (gpus a multiple of nodes) and a size");
    const double time_us = number_in("time_us"), algbw = number_in("algbw_gbs"),
                 busbw = number_in("busbw_gbs");
    // nccl-tests: algbw = size / time, busbw = algbw * factor.
    if (time_us > 0)
      p.time_s = time_us * 1e-6;
    else if (algbw > 0)
      p.time_s = p.bytes / (algbw * 1e9);
    else if (busbw > 0)
      p.time_s = p.bytes * bus_factor(p.collective, p.gpus) / (busbw * 1e9);
    else
      throw ConfigError(path, where, "gives no time, algbw or busbw to compare with");
    p.forced = forced_algorithm(cell("notes"));
    p.source = cell("source");
    p.left_out = left_out_why(p.scope, cell("notes"));
    points.push_back(std::move(p));
  }
  return points;
}

double price_point(const PublicPoint& p, const FabricFigures& f, int gpus_per_node,
                   int nics_per_node) {
  const GroupShape shape = GroupShape::even(p.gpus, p.nodes, gpus_per_node, nics_per_node);
  return isolated_time_s(plan_collective(p.collective, shape, p.bytes, f, p.forced), shape, f);
}

namespace {

// The fitted figures as free coordinates: efficiencies and shares through a logit, latencies
// through a logarithm, so that every step of the search stays in range. The protocols are NCCL's
// three; simple is the reference (its share is 1). NVLink's latency per step stays the
// topology's: no public point tells it apart from a protocol's base latency (NVLS takes two
// steps, and the public ring points inside a node are 128 MiB and more).
constexpr int kParams = 11;
using Coords = std::array<double, kParams>;

double logit(double x) {
  return std::log(x / (1 - x));
}
double logistic(double u) {
  return 1 / (1 + std::exp(-u));
}
double clamp_fraction(double x) {
  return std::clamp(x, 0.02, 0.999);
}
double log_of(double x) {
  return std::log(std::max(x, 1e-9));
}

// The protocols a fit starts from: the figures' own where they have them.
std::vector<ProtocolSpec> start_protocols(const std::vector<ProtocolSpec>& have) {
  std::vector<ProtocolSpec> p = {
      {"ll", 10e-6, 0.3, 5e-6}, {"ll128", 20e-6, 0.8, 20e-6}, {"simple", 40e-6, 1, 20e-6}};
  for (ProtocolSpec& mine : p)
    for (const ProtocolSpec& h : have)
      if (h.name == mine.name && h.base_latency_s > 0) mine = h;
  return p;
}

Coords to_coords(const FabricFigures& f) {
  const std::vector<ProtocolSpec> p = start_protocols(f.protocols);
  return {logit(clamp_fraction(f.nvlink.efficiency)),
          logit(clamp_fraction(f.nvlink.nvls_efficiency > 0 ? f.nvlink.nvls_efficiency : 0.6)),
          logit(clamp_fraction(f.nic.efficiency)),
          log_of(p[0].base_latency_s),
          logit(clamp_fraction(p[0].bandwidth_share)),
          log_of(p[0].nic_step_s),
          log_of(p[1].base_latency_s),
          logit(clamp_fraction(p[1].bandwidth_share)),
          log_of(p[1].nic_step_s),
          log_of(p[2].base_latency_s),
          log_of(p[2].nic_step_s)};
}

FabricFigures from_coords(const Coords& c, FabricFigures f) {
  f.nvlink.efficiency = logistic(c[0]);
  f.nvlink.nvls_efficiency = logistic(c[1]);
  f.nic.efficiency = logistic(c[2]);
  f.protocols = {{"ll", std::exp(c[3]), logistic(c[4]), std::exp(c[5])},
                 {"ll128", std::exp(c[6]), logistic(c[7]), std::exp(c[8])},
                 {"simple", std::exp(c[9]), 1, std::exp(c[10])}};
  return f;
}

// Nelder and Mead's simplex on the squared log error, restarted from its best point until a
// restart gains nothing: deterministic, no derivatives.
Coords minimise(const std::function<double(const Coords&)>& cost, Coords x, double step) {
  constexpr int n = kParams;
  double best = cost(x);
  for (int restart = 0; restart < 6; ++restart) {
    std::array<Coords, n + 1> p;
    std::array<double, n + 1> v;
    for (int i = 0; i <= n; ++i) {
      p[size_t(i)] = x;
      if (i > 0) p[size_t(i)][size_t(i - 1)] += step;
      v[size_t(i)] = cost(p[size_t(i)]);
    }
    for (int it = 0; it < 4000; ++it) {
      std::array<int, n + 1> order;
      for (int i = 0; i <= n; ++i) order[size_t(i)] = i;
      std::sort(order.begin(), order.end(),
                [&](int a, int b) { return v[size_t(a)] < v[size_t(b)]; });
      const int lo = order[0], hi = order[n], second = order[n - 1];
      if (v[size_t(hi)] - v[size_t(lo)] < 1e-10 * (1 + v[size_t(lo)])) break;
      Coords centre{};
      for (int i = 0; i <= n; ++i)
        if (i != hi)
          for (int k = 0; k < n; ++k) centre[size_t(k)] += p[size_t(i)][size_t(k)] / n;
      auto along = [&](double t) {
        Coords y;
        for (int k = 0; k < n; ++k)
          y[size_t(k)] = centre[size_t(k)] + t * (p[size_t(hi)][size_t(k)] - centre[size_t(k)]);
        return y;
      };
      const Coords r = along(-1);
      const double fr = cost(r);
      if (fr < v[size_t(lo)]) {
        const Coords e = along(-2);
        const double fe = cost(e);
        if (fe < fr) {
          p[size_t(hi)] = e, v[size_t(hi)] = fe;
        } else {
          p[size_t(hi)] = r, v[size_t(hi)] = fr;
        }
      } else if (fr < v[size_t(second)]) {
        p[size_t(hi)] = r, v[size_t(hi)] = fr;
      } else {
        const Coords k = along(0.5);
        const double fk = cost(k);
        if (fk < v[size_t(hi)]) {
          p[size_t(hi)] = k, v[size_t(hi)] = fk;
        } else {
          for (int i = 0; i <= n; ++i) {
            if (i == lo) continue;
            for (int d = 0; d < n; ++d)
              p[size_t(i)][size_t(d)] = p[size_t(lo)][size_t(d)] +
                                        0.5 * (p[size_t(i)][size_t(d)] - p[size_t(lo)][size_t(d)]);
            v[size_t(i)] = cost(p[size_t(i)]);
          }
        }
      }
    }
    const int lo = static_cast<int>(std::min_element(v.begin(), v.end()) - v.begin());
    const bool gained = v[size_t(lo)] < best * (1 - 1e-6);
    if (v[size_t(lo)] < best) {
      best = v[size_t(lo)];
      x = p[size_t(lo)];
    }
    if (!gained) break;
    step /= 2;
  }
  return x;
}

}  // namespace

std::string run_of(const PublicPoint& p) {
  return std::string(to_string(p.collective)) + " " + std::to_string(p.gpus) + " GPUs/" +
         std::to_string(p.nodes) + " node(s)" +
         (p.forced ? " " + std::string(to_string(*p.forced)) : "") + ", " +
         p.source.substr(0, p.source.find_first_of(" #"));
}

namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

}  // namespace

FabricFit fit_fabric(const std::vector<PublicPoint>& points, const FabricFigures& start,
                     int gpus_per_node, int nics_per_node) {
  FabricFit fit;
  for (const PublicPoint& p : points)
    if (p.left_out.empty()) fit.fitted.push_back(&p);
  // Every published run weighs the same, however many sizes it printed: the seven ring
  // reduce-scatter points are all that pin NVLink's ring efficiency against 86 NVLS ones.
  std::map<std::string, int> per_run;
  for (const PublicPoint* p : fit.fitted) ++per_run[run_of(*p)];
  std::vector<double> weight;
  for (const PublicPoint* p : fit.fitted) weight.push_back(1.0 / per_run[run_of(*p)]);
  auto cost_without = [&](size_t skip) {
    return [&, skip](const Coords& c) {
      const FabricFigures f = from_coords(c, start);
      double sum = 0;
      for (size_t i = 0; i < fit.fitted.size(); ++i) {
        if (i == skip) continue;
        const PublicPoint& p = *fit.fitted[i];
        const double e = std::log(price_point(p, f, gpus_per_node, nics_per_node) / p.time_s);
        sum += weight[i] * e * e;
      }
      return sum;
    };
  };
  const size_t none = fit.fitted.size();
  const Coords all = minimise(cost_without(none), to_coords(start), 0.5);
  fit.figures = from_coords(all, start);
  std::vector<double> abs_err, abs_loo;
  for (size_t i = 0; i < fit.fitted.size(); ++i) {
    const PublicPoint& p = *fit.fitted[i];
    // Leave-one-out: the search starts from the full fit, a point away from its optimum.
    const FabricFigures without = from_coords(minimise(cost_without(i), all, 0.1), start);
    PointError e{price_point(p, fit.figures, gpus_per_node, nics_per_node),
                 price_point(p, without, gpus_per_node, nics_per_node)};
    abs_err.push_back(std::abs(e.fitted_s / p.time_s - 1));
    abs_loo.push_back(std::abs(e.loo_s / p.time_s - 1));
    fit.errors.push_back(e);
  }
  fit.median_abs_error = median(abs_err);
  fit.median_abs_loo_error = median(abs_loo);
  std::sort(abs_loo.begin(), abs_loo.end());
  fit.p90_abs_loo_error = abs_loo.empty() ? 0 : abs_loo[abs_loo.size() * 9 / 10];
  return fit;
}

}  // namespace nodeemu::emu
