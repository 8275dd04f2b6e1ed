// `nodeemu cost` (what a GPU profile believes about any shape) and `nodeemu calibrate` (a folder
// measured by tools/measure_gpu.py becomes a profile, with each table's leave-one-out error).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <memory>
#include <optional>
#include <ostream>
#include <sstream>

#include "devices/errors.hpp"
#include "devices/gpu_profile.hpp"
#include "devices/grouped_tiling.hpp"
#include "emu/detail/commands.hpp"
#include "emu/report.hpp"

namespace nodeemu::emu {

namespace fs = std::filesystem;

namespace {

// The tables a measurement folder holds and profile.yaml's key for each (tools/measure_gpu.py
// writes these names). host_costs is required; the others are used when present.
const std::pair<const char*, const char*> kTables[] = {
    {"gemm", "gemm_bf16.csv"},
    {"gemm_fp32", "gemm_other.csv"},
    {"grouped_gemm", "grouped_gemm_bf16.csv"},
    {"attention", "attention_bf16.csv"},
    {"memory_bound", "memory_bound.csv"},
    {"pcie", "pcie.csv"},
    {"host_costs", "host_costs.csv"},
    {"host_ops", "host_ops.csv"},
    {"sm_contention", "sm_contention.csv"},
    {"overlap_contention", "overlap_contention.csv"},
};

// Whether a table's `op` column (its first) names `op`: a series the measurement took.
bool table_has_op(const fs::path& file, const std::string& op) {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(op + ",", 0) == 0) return true;
  return false;
}

struct CostArgs {
  std::string gpu, table, out;
  bool explain = false;
};

struct CalibrateArgs {
  std::string dir, out, name, errors;
};

std::string read_text(const std::string& path, const std::string& command) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec))
    throw ConfigError(path, "file", "no such file; 'nodeemu " + command + "' needs it");
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  if (!in) throw ConfigError(path, "file", "cannot be read; check its permissions");
  return s.str();
}

std::shared_ptr<const GpuProfile> profile_named(const std::string& value) {
  std::error_code ec;
  if (fs::is_directory(value, ec)) return GpuProfile::load(value);
  if (auto p = GpuProfile::builtin(value)) return p;
  std::string names;
  for (const auto& n : GpuProfile::builtin_names()) names += (names.empty() ? "" : ", ") + n;
  throw ConfigError(
      "nodeemu cost", "--gpu",
      "'" + value + "' is neither a profile folder nor a built-in profile (" + names + ")");
}

void print_loo(const std::vector<LooStats>& loo, std::ostream& out) {
  out << "leave-one-out: each measured row predicted from all the others (absolute relative "
         "error)\n";
  out << "  table                    column         rows   median      p90      max  worst at\n";
  for (const auto& s : loo) {
    const auto worst =
        std::max_element(s.per_row.begin(), s.per_row.end(),
                         [](const LooRow& a, const LooRow& b) { return a.error() < b.error(); });
    char line[200];
    std::snprintf(line, sizeof line, "  %-24s %-12s %6zu %7.2f%% %7.2f%% %7.1f%%  %s\n",
                  s.table.c_str(), s.column.c_str(), s.rows, 100 * s.median, 100 * s.p90,
                  100 * s.max, worst == s.per_row.end() ? "" : worst->where.c_str());
    out << line;
  }
}

// Every row's leave-one-out prediction, for finding the shapes a model misses.
std::string loo_rows_csv(const std::vector<LooStats>& loo) {
  std::string csv = "table,column,row,measured_seconds,predicted_seconds,error\n";
  for (const auto& s : loo)
    for (const auto& r : s.per_row) {
      char line[256];
      std::snprintf(line, sizeof line, "%s,%s,%zu,%.4e,%.4e,%.4f\n", s.table.c_str(),
                    s.column.c_str(), r.row, r.measured, r.predicted, r.predicted / r.measured - 1);
      csv += line;
    }
  return csv;
}

// A YAML double-quoted scalar.
std::string quoted(const std::string& v) {
  std::string q = "\"";
  for (char c : v) {
    if (c == '"' || c == '\\') q += '\\';
    q += (c == '\n' || c == '\r') ? ' ' : c;
  }
  return q + "\"";
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
  if (!f) throw ConfigError(path.string(), "file", "cannot be written; check the folder");
}

std::string slug(const std::string& gpu) {
  std::string s;
  for (char c : gpu) {
    if (std::isalnum(static_cast<unsigned char>(c)))
      s += char(std::tolower(static_cast<unsigned char>(c)));
    else if (!s.empty() && s.back() != '_')
      s += '_';
  }
  while (!s.empty() && s.back() == '_') s.pop_back();
  return s.empty() ? "measured_gpu" : s;
}

// The grouped kernel's tiling, from what device.json says the measurement ran: none for a loop of
// GEMMs, a GPU PyTorch has no grouped kernel for, or a device.json from before these keys.
std::optional<GroupedTiling> grouped_tiling_of(const nlohmann::json& device,
                                               const std::string& file) {
  if (!device.contains("grouped_kernel") || device["grouped_kernel"] != "torch._grouped_mm")
    return std::nullopt;
  const auto& cc =
      device.contains("compute_capability") ? device["compute_capability"] : nlohmann::json();
  int major = 0;
  if (!cc.is_string() || std::sscanf(cc.get<std::string>().c_str(), "%d.", &major) != 1)
    throw ConfigError(
        file, "compute_capability",
        "needs the GPU's compute capability as \"major.minor\" beside grouped_kernel; "
        "tools/measure_gpu.py writes it");
  return GroupedTiling::torch_grouped_mm(major, device.value("sms", 1));
}

// profile.yaml for a folder tools/measure_gpu.py wrote: its tables, the series and host-cost
// rows by the names the script uses, and the contention cases in the order it writes them.
std::string profile_yaml(const std::string& dir, const std::string& name,
                         const nlohmann::json& device, const std::string& device_file) {
  std::ostringstream y;
  const std::string gpu = device.value("gpu", std::string("unknown GPU"));
  y << "# NodeEmu GPU profile written by `nodeemu calibrate` from " << dir << ".\n"
    << "# The tables beside this file are the measurement, unchanged; README.md says how.\n"
    << "name: " << name << "\n"
    << "gpu: " << quoted(gpu) << "\n"
    << "sms: " << device.value("sms", 1) << "\n"
    << "measured: true\n"
    << "complete: false\n"
    << "tables:\n";
  for (const auto& [key, file] : kTables)
    if (fs::exists(fs::path(dir) / file)) y << "  " << key << ": " << file << "\n";
  if (fs::exists(fs::path(dir) / "grouped_gemm_bf16.csv")) {
    if (const auto t = grouped_tiling_of(device, device_file)) {
      y << "# torch._grouped_mm's tiles on this GPU (PyTorch's GroupMM.cu): the grouped table's\n"
        << "# times are waves of them over the SMs.\n"
        << "grouped_gemm_tiling:\n";
      for (const auto& f : GroupedTiling::fields())
        y << "  " << f.key << ": " << (*t).*f.member << "\n";
    } else {
      y << "# No grouped_gemm_tiling: the grouped kernel's tiles are not known for what was\n"
        << "# measured (device.json: grouped_kernel), so its time per unit of work is "
           "interpolated.\n";
    }
  }
  y << "memory_ops:\n"
    << "  copy: {series: d2d_copy}\n"
    << "  elementwise: {series: elementwise_add_scalar}\n"
    << "  norm: {series: rmsnorm_h2048}\n"
    << "  gather: {series: permute_gather_top8_h2048}\n"
    << "  scatter: {series: permute_gather_top8_h2048}\n"
    << "  activation: {series: swiglu_768_top8}\n"
    << "  router: {series: router_softmax_top8_of128, bytes_per_token: 512}\n";
  // The unfused paths' classes, where this measurement has their series (tools/gpu_measure/
  // compute_tables.py, unfused_path_rows); without them they are priced as scatter and
  // elementwise.
  for (const auto& [op, series] : {std::pair{"scatter_add", "index_add_bf16_h2048"},
                                   std::pair{"strided", "strided_elementwise_bf16"}})
    if (table_has_op(fs::path(dir) / "memory_bound.csv", series))
      y << "  " << op << ": {series: " << series << "}\n";
  y << "host_costs:\n"
    << "  launch: torch_add_host_per_launch\n"
    << "  event_record: event_record_host\n"
    << "  stream_wait: stream_wait_event_host\n"
    << "  synchronize: sync_idle\n"
    << "  graph_kernel: graph_replay_per_kernel\n"
    << "  small_d2h_sync: small_d2h_host_sync_128_int64\n"
    << "  launch_sync_roundtrip: launch_plus_sync_roundtrip\n";
  if (fs::exists(fs::path(dir) / "host_ops.csv"))
    y << "host_ops:\n"
      << "  forward: layer_forward\n"
      << "  backward: layer_backward\n";
  const fs::path oc = fs::path(dir) / "overlap_contention.csv";
  if (fs::exists(oc)) {
    std::ifstream in(oc);
    std::string line;
    std::vector<std::string> cases;
    std::getline(in, line);  // header
    while (std::getline(in, line))
      if (!line.empty()) cases.push_back(line.substr(0, line.find(',')));
    if (cases.size() < 3)
      throw ConfigError(oc.string(), "rows",
                        "needs 3 cases (GEMM beside copies, copies beside GEMM, GEMM beside "
                        "PCIe), as tools/measure_gpu.py writes them");
    y << "overlap_contention:\n"
      << "  compute_beside_memory: " << quoted(cases[0]) << "\n"
      << "  memory_beside_compute: " << quoted(cases[1]) << "\n"
      << "  compute_beside_pcie: " << quoted(cases[2]) << "\n";
  }
  return y.str();
}

std::string readme(const std::string& name, const nlohmann::json& d) {
  std::ostringstream r;
  auto get = [&](const char* k) {
    if (!d.contains(k) || d[k].is_null()) return std::string("not recorded");
    return d[k].is_string() ? d[k].get<std::string>() : d[k].dump();
  };
  r << "# GPU profile `" << name << "`: measured\n\n"
    << "Written by `nodeemu calibrate` from the output of `tools/measure_gpu.py`.\n\n"
    << "| | |\n|---|---|\n"
    << "| GPU | " << get("gpu") << ", " << get("sms") << " SMs, " << get("memory_gib")
    << " GiB, L2 " << get("l2_mb") << " MB, compute capability " << get("compute_capability")
    << " |\n"
    << "| clocks and power | SM clock " << get("sm_clock_mhz") << " MHz, power limit "
    << get("power_limit_w") << " W |\n"
    << "| software | PyTorch " << get("torch") << ", CUDA " << get("cuda") << "; grouped GEMMs by "
    << get("grouped_kernel") << " |\n"
    << "| attention backward | " << get("attention_backward")
    << (d.contains("attention_backward_by_events")
            ? "; these rows by events (not capturable): " + get("attention_backward_by_events")
            : std::string())
    << " |\n"
    << "| host | " << get("host_cpu") << " |\n"
    << "| date | " << get("measured") << " |\n"
    << "| device | " << get("device")
    << (d.value("quick", false) ? " (--quick: a pipeline "
                                  "check, not a measurement)"
                                : "")
    << " |\n\n"
    << "## Method\n\n"
    << get("method") << "\n\n"
    << "`device.json` holds the script's own record of the run.\n";
  return r.str();
}

int cost(const CostArgs& a, std::ostream& out, std::ostream& err) {
  const auto profile = profile_named(a.gpu);
  const TablePrediction p = profile->predict_table(read_text(a.table, "cost"), a.table);
  std::ostream& notes = a.out.empty() ? err : out;
  if (!a.out.empty())
    write_file_atomically(a.out, p.csv, "--out");
  else
    out << p.csv;
  notes << "# " << p.kind << " table predicted by GPU profile " << profile->provenance() << "\n";
  if (a.explain)
    for (const auto& e : p.explanations) notes << "# " << e << "\n";
  return 0;
}

int calibrate(const CalibrateArgs& a, std::ostream& out) {
  // --errors FILE: every row's leave-one-out prediction as CSV (signed error: + is too slow),
  // written before anything else is put in place, so that a bad path leaves nothing behind.
  const auto write_errors = [&](const std::vector<LooStats>& loo) {
    if (!a.errors.empty()) write_file_atomically(a.errors, loo_rows_csv(loo), "--errors");
  };
  const std::string& dir = a.dir;
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw ConfigError(
        dir, "DIR", "no such folder; pass the --out folder of tools/measure_gpu.py, or a profile");
  if (fs::exists(fs::path(dir) / "profile.yaml")) {
    // Already a profile: check it and report.
    const auto p = GpuProfile::load(dir);
    if (!a.out.empty())
      throw ConfigError("nodeemu calibrate", "--out",
                        dir + " is already a profile; copy the folder to use it elsewhere");
    const auto loo = p->leave_one_out();
    write_errors(loo);
    out << "profile " << p->provenance() << "\n";
    print_loo(loo, out);
    return 0;
  }
  const fs::path device_json = fs::path(dir) / "device.json";
  nlohmann::json device;
  try {
    device = nlohmann::json::parse(read_text(device_json.string(), "calibrate"));
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(device_json.string(), "json",
                      std::string(e.what()) + "; tools/measure_gpu.py writes this file");
  }
  if (!device.is_object() || !device.contains("gpu") || !device["gpu"].is_string() ||
      !device.contains("sms") || !device["sms"].is_number_integer() || device["sms"] < 1)
    throw ConfigError(device_json.string(), "gpu",
                      "needs 'gpu' (a string) and 'sms' (an integer >= 1); tools/measure_gpu.py "
                      "writes them");
  const std::string name = !a.name.empty() ? a.name : slug(device["gpu"].get<std::string>());
  if (name.empty() ||
      name.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") != std::string::npos)
    throw ConfigError("nodeemu calibrate", "--name",
                      "'" + name + "': use lower-case letters, digits and '_' (a folder name)");
  // Written beside the destination, checked by loading it, and only then put in place: a
  // measurement that does not load leaves nothing behind.
  const fs::path dest =
      !a.out.empty() ? fs::path(a.out) : fs::temp_directory_path() / ("nodeemu-" + name);
  if (!a.out.empty() && fs::exists(dest))
    throw ConfigError("nodeemu calibrate", "--out",
                      dest.string() + " exists; choose a new folder or remove it first");
  const fs::path tmp = dest.string() + ".tmp-calibrate";
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp);
  try {
    for (const auto& [key, file] : kTables)
      if (fs::exists(fs::path(dir) / file)) fs::copy_file(fs::path(dir) / file, tmp / file);
    fs::copy_file(device_json, tmp / "device.json");
    write_text(tmp / "profile.yaml", profile_yaml(dir, name, device, device_json.string()));
    write_text(tmp / "README.md", readme(name, device));
    const auto p = GpuProfile::load(tmp.string());
    const auto loo = p->leave_one_out();
    write_errors(loo);
    if (!a.out.empty()) {
      fs::rename(tmp, dest);
      out << "wrote profile '" << name << "' to " << dest.string() << "\n";
    } else {
      fs::remove_all(tmp);
      out << "checked " << dir << " as profile '" << name << "' (nothing written; give --out)\n";
    }
    print_loo(loo, out);
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  return 0;
}

}  // namespace

detail::CommandBody detail::add_cost(CLI::App& app, Streams io) {
  auto a = std::make_shared<CostArgs>();
  app.add_option("--gpu", a->gpu, "a GPU profile: a name (h100_sxm5) or a profile folder")
      ->type_name("PROFILE")
      ->required();
  app.add_option("table", a->table, "a CSV table in one of the profile's formats")
      ->type_name("FILE")
      ->required();
  app.add_flag("--explain", a->explain, "say which measured rows each prediction came from");
  app.add_option("--out", a->out, "write the predicted table here (default: standard output)")
      ->type_name("FILE");
  return [a, io] { return cost(*a, io.out, io.err); };
}

detail::CommandBody detail::add_calibrate(CLI::App& app, Streams io) {
  auto a = std::make_shared<CalibrateArgs>();
  app.add_option("dir", a->dir, "the --out folder of tools/measure_gpu.py, or a profile folder")
      ->type_name("DIR")
      ->required();
  app.add_option("--out", a->out, "write the profile to this new folder")->type_name("DIR");
  app.add_option("--name", a->name, "the profile's name (default: from the GPU's name)")
      ->type_name("NAME");
  app.add_option("--errors", a->errors, "write every row's leave-one-out prediction as CSV here")
      ->type_name("FILE");
  return [a, &out = io.out] { return calibrate(*a, out); };
}

}  // namespace nodeemu::emu
