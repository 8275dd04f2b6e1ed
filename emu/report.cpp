#include "emu/report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <ostream>
#include <sstream>

#include "devices/errors.hpp"

namespace nodeemu::emu {

namespace {

std::string ms(double s) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(3) << s * 1e3;
  return o.str();
}

std::string gib(std::uint64_t b) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(b < (1ull << 30) ? 3 : 2) << double(b) / double(1ull << 30);
  return o.str();
}

std::uint64_t peak_of(const RunReport& r) {
  std::uint64_t p = 0;
  for (const auto& d : r.devices) p = std::max(p, d.peak_mem_bytes);
  return p;
}

// The baseline's peak (offload and recompute off), or "-" when there was none to measure.
std::string baseline_peak(const RunReport& r) {
  std::uint64_t p = 0;
  for (const auto& d : r.devices) {
    if (!d.peak_mem_without_savers_bytes) return "-";
    p = std::max(p, *d.peak_mem_without_savers_bytes);
  }
  return r.devices.empty() ? "-" : gib(p);
}

std::string mib(std::uint64_t b) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(1) << double(b) / double(1ull << 20);
  return o.str();
}

std::uint64_t mean_offload_bytes(const RunReport& r) {
  std::uint64_t b = 0;
  for (const auto& d : r.devices) b += d.offload_bytes;
  return r.devices.empty() ? 0 : b / r.devices.size();
}

// One row of the per-GPU table without its GPU column.
std::string device_row(const DeviceReport& d, bool savers) {
  std::ostringstream os;
  os << std::setw(14) << ms(d.compute_busy_s) << std::setw(14) << ms(d.comm_busy_s) << std::setw(14)
     << ms(d.exposed_comm_s) << std::setw(14) << gib(d.peak_mem_bytes) << std::setw(14)
     << gib(d.optimizer_state_bytes);
  if (savers)
    os << std::setw(14)
       << (d.peak_mem_without_savers_bytes ? gib(*d.peak_mem_without_savers_bytes) : "-")
       << std::setw(13) << mib(d.offload_bytes) << std::setw(13) << ms(d.exposed_offload_s)
       << std::setw(14) << ms(d.recompute_s);
  return os.str();
}

// The per-GPU table. GPUs in a row with the same figures share one line ("0-15"), so a
// symmetric run of 1024 GPUs is a few lines; when more than kMaxDeviceRows lines would remain,
// each column's minimum, median and maximum over the GPUs stand for them (every GPU is in the
// --summary JSON).
constexpr std::size_t kMaxDeviceRows = 16;

void print_device_table(const RunReport& r, std::ostream& os) {
  const bool savers = r.offload || r.recompute;
  struct Line {
    std::string gpus, row;
  };
  std::vector<Line> lines;
  for (std::size_t i = 0; i < r.devices.size();) {
    const std::string row = device_row(r.devices[i], savers);
    std::size_t j = i + 1;
    while (j < r.devices.size() && device_row(r.devices[j], savers) == row) ++j;
    const std::string first = std::to_string(r.devices[i].id);
    lines.push_back({j - i == 1 ? first : first + "-" + std::to_string(r.devices[j - 1].id), row});
    i = j;
  }
  if (lines.size() > kMaxDeviceRows) {
    // Column by column: each figure's order statistics over the GPUs.
    auto stat = [&](double q) {
      DeviceReport s;
      auto pick = [&](auto field) {
        std::vector<decltype(field(r.devices[0]))> v;
        for (const auto& d : r.devices) v.push_back(field(d));
        std::sort(v.begin(), v.end());
        return v[std::size_t(q * double(v.size() - 1) + 0.5)];
      };
      s.compute_busy_s = pick([](const DeviceReport& d) { return d.compute_busy_s; });
      s.comm_busy_s = pick([](const DeviceReport& d) { return d.comm_busy_s; });
      s.exposed_comm_s = pick([](const DeviceReport& d) { return d.exposed_comm_s; });
      s.peak_mem_bytes = pick([](const DeviceReport& d) { return d.peak_mem_bytes; });
      s.optimizer_state_bytes = pick([](const DeviceReport& d) { return d.optimizer_state_bytes; });
      if (std::all_of(r.devices.begin(), r.devices.end(),
                      [](const DeviceReport& d) { return d.peak_mem_without_savers_bytes; }))
        s.peak_mem_without_savers_bytes =
            pick([](const DeviceReport& d) { return *d.peak_mem_without_savers_bytes; });
      s.offload_bytes = pick([](const DeviceReport& d) { return d.offload_bytes; });
      s.exposed_offload_s = pick([](const DeviceReport& d) { return d.exposed_offload_s; });
      s.recompute_s = pick([](const DeviceReport& d) { return d.recompute_s; });
      return device_row(s, savers);
    };
    os << "\n"
       << r.devices.size() << " GPUs in " << lines.size()
       << " different rows: each column's spread over the GPUs (--summary has every GPU)";
    lines = {{"min", stat(0)}, {"median", stat(0.5)}, {"max", stat(1)}};
  }
  std::size_t w = 3;
  for (const auto& l : lines) w = std::max(w, l.gpus.size());
  os << "\n  " << std::setw(int(w)) << "GPU"
     << "    compute ms       comm ms    exposed ms  peak mem GiB  optim st GiB";
  if (savers) os << "  w/o offl+rec  offload MiB  offl exp ms  recompute ms";
  os << "\n";
  for (const auto& l : lines) os << "  " << std::setw(int(w)) << l.gpus << l.row << "\n";
}

}  // namespace

std::string fixed(double v, int digits) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(digits) << v;
  return o.str();
}

std::string hex(std::uint64_t v) {
  std::ostringstream o;
  o << "0x" << std::hex << std::setw(16) << std::setfill('0') << v;
  return o.str();
}

namespace {

// The figures published runs quote: tokens/s, Megatron-LM's TFLOP/s per GPU and MFU, and how
// much of the communication compute hid, with the collectives that stayed exposed.
void print_throughput(const RunReport& r, std::ostream& os) {
  os << "per GPU: " << fixed(r.tokens_per_s_per_gpu, 0) << " tokens/s, "
     << fixed(r.model_tflops_per_gpu, 1)
     << " TFLOP/s (model FLOPs as Megatron-LM counts them), MFU " << fixed(100 * r.mfu, 1)
     << "% of the " << fixed(r.peak_bf16_tflops, 0) << " TFLOP/s dense bf16 peak (datasheet)\n";
  os << "communication hidden behind compute: " << fixed(100 * r.hidden_comm_share, 1)
     << "%; the GPU idle while its host issued work (host-bound): " << ms(r.host_bound_s)
     << " ms\n";
  // The largest first, at most `most` of them.
  auto largest = [&os](const char* what, const std::map<std::string, double>& m, std::size_t most) {
    std::vector<std::pair<double, std::string>> by;
    for (const auto& [key, s] : m) by.emplace_back(-s, key);
    std::sort(by.begin(), by.end());
    if (by.empty()) return;
    os << "exposed communication by " << what << ":";
    for (std::size_t i = 0; i < by.size() && i < most; ++i)
      os << (i ? ", " : " ") << by[i].second << " " << ms(-by[i].first) << " ms";
    os << "\n";
  };
  largest("group", r.exposed_comm_by_group, r.exposed_comm_by_group.size());
  largest("collective (the five largest)", r.exposed_comm_by_name, 5);
}

// Where a step's time goes, per GPU: some kernel or copy runs; a collective runs and nothing
// else does (exposed); nothing runs while the host issues work (host-bound); the rest (nothing
// runs and the host waits too: on a dependency, a peer, the pipeline).
struct StepParts {
  double busy, exposed, host, idle;
};
StepParts parts_of(const RunReport& r) {
  const double busy = r.compute_utilisation * r.step_time_s;
  return {busy, r.exposed_comm_s, r.host_bound_s,
          std::max(0.0, r.step_time_s - busy - r.exposed_comm_s - r.host_bound_s)};
}

// "overlap against no_overlap: faster by 12.3 ms (18.0 %): ..." in the parts above.
std::string why_faster(const Case& base, const Case& c) {
  const StepParts a = parts_of(base.report), b = parts_of(c.report);
  const double d = c.report.step_time_s - base.report.step_time_s;
  auto change = [](double x, const char* what) {
    return std::string(what) + " " + ms(std::abs(x)) + " ms " + (x <= 0 ? "less" : "more");
  };
  std::ostringstream o;
  o << c.name << " against " << base.name << ": " << (d <= 0 ? "faster" : "slower") << " by "
    << ms(std::abs(d)) << " ms (" << fixed(100 * std::abs(d) / base.report.step_time_s, 1)
    << " %): " << change(b.exposed - a.exposed, "exposed communication") << ", "
    << change(b.busy - a.busy, "kernels and copies running") << ", "
    << change(b.host - a.host, "the GPU waiting on its host") << ", "
    << change(b.idle - a.idle, "the GPU idle otherwise (waiting on a dependency)");
  return o.str();
}

}  // namespace

void print_summary(const RunReport& r, std::ostream& os) {
  os << "recipe " << r.recipe << " (" << r.mode << "), " << r.world << " GPUs of " << r.topology
     << ", schedule " << r.schedule << ", GEMMs " << r.gemm_kernel << "\n";
  if (r.ranks_run < r.world)
    os << "representative ranks: " << r.ranks_run << " of the " << r.world
       << " ranks ran (one data-parallel replica); the other GPUs report their figures "
          "(emulator.ranks: all runs every one)\n";
  os << "\n";
  // The MTP loss gets a column only in runs that report it.
  const bool mtp = !r.iterations.empty() && r.iterations[0].mtp_loss.has_value();
  const bool norm = !r.iterations.empty() && r.iterations[0].grad_norm.has_value();
  os << "  iter      loss" << (mtp ? "  mtp loss" : "") << (norm ? " grad norm" : "")
     << "   step (virtual ms)\n";
  auto fixed6 = [](const std::optional<double>& v) {
    std::ostringstream o;
    if (v)
      o << std::fixed << std::setprecision(6) << *v;
    else
      o << "-";
    return o.str();
  };
  for (const auto& it : r.iterations) {
    os << "  " << std::setw(4) << it.iter << std::setw(10) << fixed6(it.loss);
    if (mtp) os << std::setw(10) << fixed6(it.mtp_loss);
    if (norm) os << std::setw(10) << fixed6(it.grad_norm);
    os << std::setw(20) << ms(it.step_time_s)
       << (it.iter <= r.warmup_iterations ? "   (warm-up)" : "") << "\n";
  }
  os << "\nsteady mean step " << ms(r.step_time_s) << " ms (virtual), over "
     << r.iterations.size() - std::size_t(r.warmup_iterations) << " iterations; "
     << r.warmup_iterations << " warm-up iteration" << (r.warmup_iterations == 1 ? "" : "s")
     << " excluded\n";
  os << "comm per device per step: exposed " << ms(r.exposed_comm_s) << " ms of "
     << ms(r.total_comm_s) << " ms total; compute utilisation " << std::fixed
     << std::setprecision(1) << 100 * r.compute_utilisation << "%\n";
  print_throughput(r, os);
  if (r.offload) {
    const double hidden =
        r.total_offload_s > 0 ? 100 * (1 - r.exposed_offload_s / r.total_offload_s) : 100.0;
    os << "offload per device per step: " << mib(mean_offload_bytes(r))
       << " MiB to the host; copies " << ms(r.total_offload_s) << " ms, " << ms(r.exposed_offload_s)
       << " ms of it with no kernel running (" << std::fixed << std::setprecision(1) << hidden
       << "% hidden)\n";
  }
  if (r.recompute) os << "recompute per device per step: " << ms(r.recompute_s) << " ms\n";
  if (r.over_budget_reruns >= 0)
    os << "sync-free budget: " << r.over_budget_reruns << " of " << r.iterations.size()
       << " steps dropped pairs and ran again dropless"
       << (r.over_budget_reruns ? " (raise moe_expert_rank_capacity_factor)" : "") << "\n";
  print_device_table(r, os);
  if (r.offload || r.bindpcie) {
    // Where each rank's host side lives: bindpcie puts it on the GPU's own NUMA node.
    os << "\nhost side (" << (r.bindpcie ? "bindpcie" : "unbound: the default policy")
       << "):\n  GPU  GPU NUMA  host NUMA  real NUMA  pinned MiB  host thread CPUs\n";
    for (const auto& d : r.devices)
      os << "  " << std::setw(3) << d.id << std::setw(10) << d.gpu_numa << std::setw(11)
         << d.host_numa << (d.host_numa != d.gpu_numa ? "*" : " ") << std::setw(10)
         << (d.host_real_numa >= 0 ? std::to_string(d.host_real_numa) : std::string("-"))
         << std::setw(12) << mib(d.pinned_host_bytes) << "  "
         << (d.host_cpus.empty() ? std::string("unbound") : d.host_cpus) << "\n";
    os << "  (* far socket: PCIe copies to this memory pay the topology's remote_numa_factor)\n";
  }
  os << "\nclock: GPU profile " << r.gpu_profile << "\n";
  for (const auto& k : r.unpriced_kernels)
    os << "warning: kernel " << k
       << " has no table in the GPU profile; priced by the roofline over its best measured "
          "rates\n";
  if (!r.keys_without_effect.empty()) {
    os << "no effect on the emulated run (text, data, logging, the learning-rate schedule, or how "
          "NodeEmu uses this machine):";
    for (const auto& k : r.keys_without_effect) os << " " << k;
    os << "\n";
  }
  os << "numerics hash " << (r.numerics_hash ? hex(*r.numerics_hash) : "- (meta mode)")
     << ", timeline hash " << hex(r.timeline_hash) << "\n";
  os << "wall time " << std::fixed << std::setprecision(2) << r.wall_time_s << " s for "
     << r.device_ops << " device operations\n";
  if (r.functional_kernel_flops > 0)
    os << "functional work: " << std::setprecision(2) << r.functional_kernel_flops / 1e9
       << " GFLOP of kernels, " << r.functional_kernel_flops / 1e9 / r.wall_time_s
       << " GFLOP/s over the wall time\n";
  if (r.peak_host_bytes && r.world > 0) {
    os << "host memory: peak " << gib(*r.peak_host_bytes) << " GiB resident, "
       << gib(*r.peak_host_bytes / std::uint64_t(r.world)) << " GiB per emulated GPU";
    if (r.mode == "meta") {
      os << " (meta mode: device memory is accounted, not held)\n";
    } else {
      std::uint64_t device_peaks = 0;
      for (const auto& d : r.devices) device_peaks += d.peak_mem_bytes;
      os << " (device memory at its peak: " << gib(device_peaks / std::uint64_t(r.world))
         << " GiB per GPU; released blocks kept for reuse: at most "
         << gib(r.peak_kept_block_bytes / std::uint64_t(r.world))
         << " GiB per GPU; the rest is the emulator and the host side)\n";
    }
  }
}

void write_file_atomically(const std::string& path, const std::string& text,
                           const std::string& flag) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp);
    if (!f) throw ConfigError(flag, path, "cannot write here; check the folder exists");
    f << text;
    if (!f) {
      std::filesystem::remove(tmp);
      throw ConfigError(flag, path, "writing failed");
    }
  }
  std::filesystem::rename(tmp, path);
}

void write_summary_file(const RunReport& r, const Recipe& recipe, const std::string& path) {
  std::ostringstream os;
  write_summary_json(r, recipe, os);
  write_file_atomically(path, os.str(), "--summary");
}

void print_compare(const std::vector<Case>& cases, std::ostream& os) {
  // Each column: its header and its text per case; a column whose every case shows `empty` (no
  // offload, no recompute, no baseline, meta mode's missing hash) is left out.
  struct Column {
    std::string header, empty;
    std::vector<std::string> cells;
  };
  const double base = cases.empty() ? 1 : cases.front().report.step_time_s;
  std::vector<Column> cols = {{"schedule", "", {}},
                              {"steady mean ms", "", {}},
                              {"speedup", "", {}},
                              {"TFLOP/s/GPU", "", {}},
                              {"MFU", "", {}},
                              {"comm hidden", "", {}},
                              {"exposed comm ms", "", {}},
                              {"peak mem GiB", "", {}},
                              {"w/o offl+rec", "-", {}},
                              {"offload MiB", mib(0), {}},
                              {"offl exp/total ms", ms(0) + "/" + ms(0), {}},
                              {"recompute ms", ms(0), {}},
                              {"numerics hash", "-", {}}};
  for (const auto& c : cases) {
    const RunReport& r = c.report;
    std::ostringstream speedup;
    speedup << std::fixed << std::setprecision(3) << base / r.step_time_s << "x";
    const std::vector<std::string> cells = {
        r.schedule,
        ms(r.step_time_s),
        speedup.str(),
        fixed(r.model_tflops_per_gpu, 1),
        fixed(100 * r.mfu, 1) + "%",
        fixed(100 * r.hidden_comm_share, 1) + "%",
        ms(r.exposed_comm_s),
        gib(peak_of(r)),
        baseline_peak(r),
        mib(mean_offload_bytes(r)),
        ms(r.exposed_offload_s) + "/" + ms(r.total_offload_s),
        ms(r.recompute_s),
        r.numerics_hash ? hex(*r.numerics_hash) : std::string("-")};
    for (std::size_t i = 0; i < cols.size(); ++i) cols[i].cells.push_back(cells[i]);
  }
  std::erase_if(cols, [](const Column& c) {
    return !c.empty.empty() &&
           std::all_of(c.cells.begin(), c.cells.end(), [&](const auto& x) { return x == c.empty; });
  });
  std::size_t w = 4;
  for (const auto& c : cases) w = std::max(w, c.name.size());
  os << std::left << std::setw(int(w)) << "case" << std::right;
  for (auto& c : cols) {
    std::size_t cw = c.header.size();
    for (const auto& x : c.cells) cw = std::max(cw, x.size());
    c.header = std::string(cw - c.header.size(), ' ') + c.header;
    for (auto& x : c.cells) x = std::string(cw - x.size(), ' ') + x;
    os << " | " << c.header;
  }
  os << "\n";
  for (std::size_t i = 0; i < cases.size(); ++i) {
    os << std::left << std::setw(int(w)) << cases[i].name << std::right;
    for (const auto& c : cols) os << " | " << c.cells[i];
    os << "\n";
  }
  os << "speedup = the first case's steady step / this case's (above 1: faster)\n";
  for (std::size_t i = 1; i < cases.size(); ++i) os << why_faster(cases.front(), cases[i]) << "\n";
}

}  // namespace nodeemu::emu
