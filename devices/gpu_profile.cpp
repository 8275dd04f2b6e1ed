#include "devices/gpu_profile.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <sstream>

#include "devices/check.hpp"
#include "devices/detail/builtin_profiles.hpp"
#include "devices/detail/profile_models.hpp"
#include "devices/errors.hpp"
#include "schema/yaml_schema.hpp"

namespace nodeemu {

using namespace schema;

double Contention::with_sms_held(double fraction) const {
  if (fraction <= 0) return 1;
  if (fraction >= 1) return std::numeric_limits<double>::infinity();
  if (sm_held.empty()) return 1 / (1 - fraction);
  if (fraction <= sm_held.front().first) {
    // From no slowdown at no SMs held to the first measured point.
    const auto [f0, s0] = sm_held.front();
    return 1 + (s0 - 1) * fraction / f0;
  }
  for (std::size_t i = 1; i < sm_held.size(); ++i) {
    const auto [f0, s0] = sm_held[i - 1];
    const auto [f1, s1] = sm_held[i];
    if (fraction <= f1) return s0 + (s1 - s0) * (fraction - f0) / (f1 - f0);
  }
  // Past the last measured point the slowdown grows in proportion to the SMs left, from the
  // measured level.
  const auto [fl, sl] = sm_held.back();
  return sl * (1 - fl) / (1 - fraction);
}

double Contention::compute_beside_hbm_share(double share) const {
  // Linear in the share taken, from none at no share to the measured co-run at the copy
  // kernel's share: the only HBM-sharing point the tables hold.
  const double copy_share = 1 / memory_beside_compute;
  return 1 + (compute_beside_memory - 1) * std::clamp(share, 0.0, 1.0) / copy_share;
}

namespace {

const Field& profile_schema() {
  auto name_of = [](const char* key, const char* what) { return optional(str(key, what)); };
  static const Field root = map(
      "",
      {
          str("name", "profile name, the folder's name, such as h100_sxm5"),
          str("gpu", "the GPU as the measurement names it"),
          integer("sms", "SMs of the measured GPU (the SM-contention table counts them)", ints(1)),
          boolean("measured", "true: measured on this GPU; false: derived by datasheet ratios"),
          optional(boolean("complete", "true: a kernel no table prices is an error")),
          optional(map("derived",
                       {
                           str("from", "the measured profile the tables come from"),
                           real("compute", "dense bf16 TFLOP/s ratio to that GPU", kPositive),
                           real("hbm", "HBM bandwidth ratio to that GPU", kPositive),
                           real("pcie", "PCIe bandwidth ratio to that GPU", kPositive),
                       })),
          optional(map("tables",
                       {
                           name_of("gemm", "bf16 GEMM table"),
                           name_of("gemm_fp32", "fp32 GEMM table"),
                           name_of("grouped_gemm", "grouped GEMM table"),
                           name_of("attention", "attention table"),
                           name_of("memory_bound", "memory-bound kernel table"),
                           name_of("memory_anatomy",
                                   "memory-bound series read from a layer's kernel trace, not "
                                   "measured as a table (memory_bound.csv's columns + source)"),
                           name_of("pcie", "PCIe copy table"),
                           str("host_costs", "host cost table"),
                           name_of("host_ops", "framework host cost table (host_ops.csv)"),
                           name_of("sm_contention", "SM contention table"),
                           name_of("overlap_contention", "HBM and PCIe contention table"),
                       })),
          optional(map("grouped_gemm_tiling",
                       [] {
                         std::vector<Field> f;
                         for (const auto& t : GroupedTiling::fields())
                           f.push_back(integer(t.key, t.help, ints(t.least)));
                         return f;
                       }())),
          optional(map("memory_ops",
                       [] {
                         std::vector<Field> ops;
                         auto entry = [](const char* op) {
                           return map(op, {str("series", "the memory_bound.csv op that prices it"),
                                           optional(real("bytes_per_token",
                                                         "bytes one token of a series measured "
                                                         "by tokens stands for",
                                                         kPositive))});
                         };
                         for (const char* op : {"copy", "elementwise", "norm", "gather", "scatter",
                                                "activation", "router"})
                           ops.push_back(entry(op));
                         // Optional: without them these classes are priced as scatter and
                         // elementwise (MemoryOp in kernel_shape.hpp).
                         for (const char* op : {"scatter_add", "strided"})
                           ops.push_back(optional(entry(op)));
                         return ops;
                       }())),
          optional(map("host_costs",
                       {
                           str("launch", "host_costs.csv row of one eager launch"),
                           str("event_record", "row of an event record"),
                           str("stream_wait", "row of a stream wait"),
                           str("synchronize", "row of a synchronize on an idle stream"),
                           str("graph_kernel", "row of a kernel replayed in a CUDA graph"),
                           str("small_d2h_sync", "row of a small D2H read on the host"),
                           str("launch_sync_roundtrip", "row of a launch plus synchronize"),
                       })),
          optional(map("host_ops",
                       {
                           str("forward", "host_ops.csv row of an eager layer's forward"),
                           str("backward", "host_ops.csv row of its backward"),
                       })),
          optional(map("overlap_contention",
                       {
                           str("compute_beside_memory", "case: a GEMM beside a copy kernel"),
                           str("memory_beside_compute", "case: the copy kernel beside the GEMM"),
                           str("compute_beside_pcie", "case: a GEMM beside PCIe copies"),
                       })),
      });
  return root;
}

// Where a profile's files come from: a folder, or the copies compiled into the binary.
struct FileSource {
  std::string origin;  // the folder, or "<built-in>/name"
  const std::map<std::string, std::string>* builtin = nullptr;

  std::string path(const std::string& file) const { return origin + "/" + file; }
  bool has(const std::string& file) const {
    if (builtin) return builtin->count(file) > 0;
    std::error_code ec;
    return std::filesystem::is_regular_file(path(file), ec);
  }
  std::string read(const std::string& file, const std::string& key) const {
    if (builtin) {
      auto it = builtin->find(file);
      if (it == builtin->end())
        throw ConfigError(path("profile.yaml"), key, "'" + file + "' is not in the profile");
      return it->second;
    }
    std::ifstream in(path(file), std::ios::binary);
    if (!in)
      throw ConfigError(path("profile.yaml"), key,
                        "'" + file + "' cannot be read in " + origin + "; check the name");
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
  }
};

}  // namespace

struct ProfileLoader {
  static std::shared_ptr<const GpuProfile> load(const FileSource& src);
  static detail::CsvTable table(const FileSource& src, const std::string& file,
                                const std::string& key) {
    return detail::CsvTable::parse(src.read(file, key), src.path(file));
  }
};

namespace {

FileSource folder_source(const std::string& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    throw ConfigError(dir, "profile",
                      "no such profile folder; pass one holding profile.yaml, such as "
                      "configs/gpus/h100_sxm5");
  if (!std::filesystem::is_regular_file(dir + "/profile.yaml", ec))
    throw ConfigError(dir + "/profile.yaml", "file",
                      "missing; a profile folder holds profile.yaml beside its tables (nodeemu "
                      "calibrate writes one)");
  std::string d = dir;
  while (d.size() > 1 && d.back() == '/') d.pop_back();
  return FileSource{d, nullptr};
}

// A derived profile's tables are its base's, with every time scaled by the datasheet ratio of the
// resource that bounds it, above a start-up floor that no faster GPU removes (a kernel's, or for
// PCIe copies the smallest copy's): t' = min(t, floor) + max(0, t - floor) / ratio.
void scale_times(detail::CsvTable& t, const std::vector<std::string>& columns, double ratio,
                 double floor_s) {
  for (std::size_t r = 0; r < t.rows(); ++r)
    for (const auto& c : columns) {
      if (!t.has(c) || t.empty(r, c)) continue;
      const double v = t.number(r, c);
      t.set_number(r, c, std::min(v, floor_s) + std::max(0.0, v - floor_s) / ratio);
    }
}

// The row of a host table (host_costs.csv, host_ops.csv) that profile.yaml's `key` names.
std::size_t host_row(const detail::CsvTable& t, const std::string& what, const std::string& key,
                     const std::string& profile_yaml) {
  t.require({"what", "seconds"});
  for (std::size_t r = 0; r < t.rows(); ++r)
    if (t.text(r, "what") == what) return r;
  throw ConfigError(profile_yaml, key,
                    "names row '" + what + "', which " + t.file() + " does not have");
}

}  // namespace

std::shared_ptr<const GpuProfile> ProfileLoader::load(const FileSource& src) {
  const std::string yaml_file = src.path("profile.yaml");
  const YAML::Node doc = load_document(src.read("profile.yaml", "file"), yaml_file,
                                       "a profile map starting with 'name:'");
  validate(doc, profile_schema(), yaml_file);
  Reader r(doc, yaml_file);
  std::shared_ptr<GpuProfile> p(new GpuProfile());
  p->name_ = r.str("name");
  p->gpu_ = r.str("gpu");
  p->sms_ = r.integer("sms");
  p->measured_ = r.boolean("measured");
  p->complete_ = r.has("complete") && r.boolean("complete");
  p->origin_ = src.origin;

  if (r.has("derived")) {
    if (p->measured_) r.fail("measured", "a derived profile is not measured; set measured: false");
    for (const char* k : {"tables", "grouped_gemm_tiling", "memory_ops", "host_costs", "host_ops",
                          "overlap_contention"})
      if (r.has(k))
        r.fail(k, "a derived profile takes its tables from 'derived.from'; remove this key");
    const std::string base_name = r.str("derived.from");
    std::shared_ptr<const GpuProfile> base;
    const FileSource sibling{src.builtin ? "" : src.origin + "/../" + base_name, nullptr};
    if (!src.builtin && sibling.has("profile.yaml"))
      base = load(sibling);
    else
      base = GpuProfile::builtin(base_name);
    if (!base) r.fail("derived.from", "no profile '" + base_name + "' beside this one or built in");
    if (!base->measured_)
      r.fail("derived.from", "'" + base_name + "' is itself derived; derive from a measured one");
    const double compute = r.si("derived.compute", 0), hbm = r.si("derived.hbm", 0),
                 pcie = r.si("derived.pcie", 0);
    detail::ProfileTables t = base->models_->tables();
    const double floor_s = base->kernel_floor_s();
    for (auto* tab : {&t.gemm, &t.gemm_fp32, &t.grouped_gemm})
      if (*tab) scale_times(**tab, {"seconds"}, compute, floor_s);
    if (t.attention) scale_times(*t.attention, {"fwd_seconds", "bwd_seconds"}, compute, floor_s);
    if (t.memory_bound) scale_times(*t.memory_bound, {"seconds"}, hbm, floor_s);
    if (t.memory_anatomy) scale_times(*t.memory_anatomy, {"seconds"}, hbm, floor_s);
    if (t.pcie) {
      // A copy's start-up is the smallest copy measured (the DMA's latency), not a kernel's.
      double copy_floor = std::numeric_limits<double>::infinity();
      for (std::size_t i = 0; i < t.pcie->rows(); ++i)
        copy_floor = std::min(copy_floor, t.pcie->number(i, "seconds"));
      scale_times(*t.pcie, {"seconds"}, pcie, copy_floor);
    }
    p->models_ = std::make_unique<detail::ProfileModels>(std::move(t));
    p->host_ = base->host_;
    p->contention_ = base->contention_;
    p->memory_series_ = base->memory_series_;
    char ratios[160];
    std::snprintf(ratios, sizeof ratios, "compute x%.3g, HBM x%.3g, PCIe x%.3g", compute, hbm,
                  pcie);
    p->provenance_ = p->name_ + ": derived, not measured: " + base->name_ + " (" + base->gpu_ +
                     ") scaled by datasheet ratios (" + ratios + ")";
    return p;
  }
  if (!p->measured_)
    r.fail("measured", "a profile that is not measured is derived: add 'derived:' with its base");
  if (!r.has("tables")) r.fail("tables", "missing; a measured profile lists its tables");

  detail::ProfileTables t;
  auto opt_table = [&](const char* key, std::optional<detail::CsvTable>& out) {
    const std::string k = std::string("tables.") + key;
    if (r.has(k)) out = table(src, r.str(k), k);
  };
  opt_table("gemm", t.gemm);
  opt_table("gemm_fp32", t.gemm_fp32);
  opt_table("grouped_gemm", t.grouped_gemm);
  opt_table("attention", t.attention);
  opt_table("memory_bound", t.memory_bound);
  opt_table("memory_anatomy", t.memory_anatomy);
  if (t.memory_anatomy && !t.memory_bound)
    r.fail("tables.memory_anatomy", "needs tables.memory_bound, whose floor it shares");
  opt_table("pcie", t.pcie);
  if (r.has("grouped_gemm_tiling")) {
    if (!t.grouped_gemm) r.fail("grouped_gemm_tiling", "there is no grouped_gemm table to tile");
    // The waves are as wide as the measured GPU's SMs: a derived profile keeps its base's tiling.
    GroupedTiling g;
    for (const auto& f : GroupedTiling::fields())
      g.*f.member = r.integer(std::string("grouped_gemm_tiling.") + f.key);
    g.sms = p->sms_;
    t.grouped_tiling = g;
  }

  // Host costs (required: every launch pays one).
  if (!r.has("host_costs")) r.fail("host_costs", "missing; say which host_costs.csv row is which");
  {
    const detail::CsvTable h = table(src, r.str("tables.host_costs"), "tables.host_costs");
    auto row = [&](const char* k) {
      const std::string key = std::string("host_costs.") + k;
      return h.number(host_row(h, r.str(key), key, yaml_file), "seconds");
    };
    HostCosts& c = p->host_;
    c.launch_s = row("launch");
    c.event_record_s = row("event_record");
    c.stream_wait_s = row("stream_wait");
    c.synchronize_s = row("synchronize");
    c.graph_kernel_s = row("graph_kernel");
    c.small_d2h_sync_s = row("small_d2h_sync");
    const double roundtrip = row("launch_sync_roundtrip");
    // The round trip is launch + latency + the smallest kernel + synchronize: the latency is
    // what is left. The smallest kernel is the memory table's floor (a graph-timed kernel).
    double smallest = 0;
    if (t.memory_bound) {
      for (std::size_t i = 0; i < t.memory_bound->rows(); ++i) {
        const double s = t.memory_bound->number(i, "seconds");
        smallest = smallest == 0 ? s : std::min(smallest, s);
      }
    }
    c.launch_latency_s = std::max(0.0, roundtrip - c.launch_s - c.synchronize_s - smallest);
  }
  // The framework's host cost per kernel of an eager layer, forward and backward (host_ops.csv:
  // a layer's host issue time over the kernels it launched; tools/gpu_measure/host_op_tables.py).
  if (r.has("tables.host_ops") != r.has("host_ops"))
    r.fail(r.has("host_ops") ? "tables.host_ops" : "host_ops",
           "missing: host_ops.csv and the host_ops rows come together");
  if (r.has("host_ops")) {
    const detail::CsvTable h = table(src, r.str("tables.host_ops"), "tables.host_ops");
    h.require({"what", "seconds", "kernels"});
    HostCosts& c = p->host_;
    for (const char* k : {"forward", "backward"}) {
      const std::string key = std::string("host_ops.") + k;
      const std::size_t row = host_row(h, r.str(key), key, yaml_file);
      const double kernels = double(h.count(row, "kernels"));
      (k[0] == 'f' ? c.forward_kernel_s : c.backward_kernel_s) = h.number(row, "seconds") / kernels;
    }
  }

  // Contention.
  if (r.has("tables.sm_contention")) {
    const detail::CsvTable s = table(src, r.str("tables.sm_contention"), "tables.sm_contention");
    s.require({"case", "sms_held_by_other_kernel", "slowdown"});
    double last = 0;
    for (std::size_t i = 0; i < s.rows(); ++i) {
      if (s.empty(i, "sms_held_by_other_kernel")) continue;  // the GEMM alone
      const double held = s.number(i, "sms_held_by_other_kernel");
      if (held <= last)
        s.fail(i, "sms_held_by_other_kernel", "SMs held must increase down the table");
      if (held >= p->sms_)
        s.fail(i, "sms_held_by_other_kernel",
               "holds every SM of the " + std::to_string(p->sms_) + " in profile.yaml 'sms'");
      last = held;
      // A measured speed-up (clocks rising as a spinning kernel idles its SMs) is read as none:
      // a kernel beside another never runs faster than alone in this model.
      p->contention_.sm_held.emplace_back(held / p->sms_, std::max(1.0, s.number(i, "slowdown")));
    }
  }
  if (r.has("tables.overlap_contention")) {
    const detail::CsvTable o =
        table(src, r.str("tables.overlap_contention"), "tables.overlap_contention");
    o.require({"case", "slowdown"});
    if (!r.has("overlap_contention"))
      r.fail("overlap_contention", "missing; say which overlap_contention.csv case is which");
    auto factor = [&](const char* k) {
      const std::string key = std::string("overlap_contention.") + k, what = r.str(key);
      for (std::size_t i = 0; i < o.rows(); ++i)
        if (o.text(i, "case") == what) return std::max(1.0, o.number(i, "slowdown"));
      r.fail(key, "names case '" + what + "', which " + o.file() + " does not have");
    };
    p->contention_.compute_beside_memory = factor("compute_beside_memory");
    p->contention_.memory_beside_compute = factor("memory_beside_compute");
    p->contention_.compute_beside_pcie = factor("compute_beside_pcie");
  }

  // Memory-bound kernel classes -> measured series.
  if (t.memory_bound) {
    if (!r.has("memory_ops"))
      r.fail("memory_ops", "missing; say which memory_bound.csv op prices each kernel class");
    detail::MemoryBoundModel::validate(*t.memory_bound);
    if (t.memory_anatomy) detail::MemoryBoundModel::validate(*t.memory_anatomy);
    auto has_series = [](const std::optional<detail::CsvTable>& tab, const std::string& s) {
      for (std::size_t i = 0; tab && i < tab->rows(); ++i)
        if (tab->text(i, "op") == s) return true;
      return false;
    };
    for (MemoryOp op : kMemoryOps) {
      const std::string key = std::string("memory_ops.") + memory_op_name(op);
      if (!r.has(key) && (op == MemoryOp::ScatterAdd || op == MemoryOp::Strided)) {
        // Optional classes: priced as the class they refine (kernel_shape.hpp).
        p->memory_series_[op] = p->memory_series_.at(
            op == MemoryOp::ScatterAdd ? MemoryOp::Scatter : MemoryOp::Elementwise);
        continue;
      }
      const std::string series = r.str(key + ".series");
      const bool measured = has_series(t.memory_bound, series);
      if (!measured && !has_series(t.memory_anatomy, series))
        r.fail(key + ".series", "names op '" + series + "', which " + t.memory_bound->file() +
                                    (t.memory_anatomy ? " and " + t.memory_anatomy->file() : "") +
                                    " do not have");
      const detail::CsvTable& in = measured ? *t.memory_bound : *t.memory_anatomy;
      const bool tokens = detail::MemoryBoundModel::by_tokens(in, series);
      const bool per_token = r.has(key + ".bytes_per_token");
      if (tokens && !per_token)
        r.fail(key, "'" + series + "' is measured by tokens; add bytes_per_token");
      if (!tokens && per_token)
        r.fail(key + ".bytes_per_token", "'" + series + "' is measured by bytes; remove it");
      p->memory_series_[op] = {series, per_token ? r.si(key + ".bytes_per_token", 0) : 0.0,
                               !measured};
    }
  }
  p->models_ = std::make_unique<detail::ProfileModels>(std::move(t));
  p->provenance_ = p->name_ + ": measured on " + p->gpu_ + " (" + p->origin_ + ")";
  return p;
}

GpuProfile::GpuProfile() = default;
GpuProfile::~GpuProfile() = default;

std::optional<GroupedTiling> GpuProfile::grouped_tiling() const {
  return models_->tables().grouped_tiling;
}

double GpuProfile::kernel_floor_s() const {
  return models_->floor_s();
}

std::shared_ptr<const GpuProfile> GpuProfile::load(const std::string& dir) {
  return ProfileLoader::load(folder_source(dir));
}

std::shared_ptr<const GpuProfile> GpuProfile::builtin(const std::string& name) {
  // Loaded once per name: the tables are the same for every node of the process.
  // Recursive: a built-in derived profile loads its built-in base from inside the lock.
  static std::recursive_mutex mu;
  static std::map<std::string, std::shared_ptr<const GpuProfile>> cache;
  std::lock_guard lk(mu);
  if (auto it = cache.find(name); it != cache.end()) return it->second;
  const auto& all = detail::builtin_profile_files();
  auto it = all.find(name);
  if (it == all.end()) return nullptr;
  auto p = ProfileLoader::load(FileSource{"<built-in>/" + name, &it->second});
  cache[name] = p;
  return p;
}

std::vector<std::string> GpuProfile::builtin_names() {
  std::vector<std::string> out;
  for (const auto& [name, files] : detail::builtin_profile_files()) out.push_back(name);
  return out;
}

std::shared_ptr<const GpuProfile> GpuProfile::resolve(const std::string& value,
                                                      const std::string& topology_file) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path topo_dir = fs::path(topology_file).parent_path();
  const bool real_file = fs::is_regular_file(topology_file, ec);
  if (value.find('/') != std::string::npos) {
    const fs::path dir = fs::path(value).is_absolute() ? fs::path(value) : topo_dir / value;
    return load(dir.string());
  }
  if (real_file) {
    const fs::path dir = topo_dir / ".." / "gpus" / value;
    if (fs::is_regular_file(dir / "profile.yaml", ec)) return load(dir.lexically_normal().string());
  }
  if (auto p = builtin(value)) return p;
  std::string names;
  for (const auto& n : builtin_names()) names += (names.empty() ? "" : ", ") + n;
  throw ConfigError(topology_file, "gpu.profile",
                    "no GPU profile '" + value + "' in " +
                        (real_file ? (topo_dir / ".." / "gpus").lexically_normal().string()
                                   : std::string("this topology's folder")) +
                        " or built in (" + names +
                        "); measure one with tools/measure_gpu.py and "
                        "nodeemu calibrate");
}

KernelPrice GpuProfile::price(const Work& w) const {
  if (w.fixed_s > 0) return {w.fixed_s, true};
  const KernelShape& s = w.shape;
  const detail::ProfileModels& m = *models_;
  switch (s.kind) {
    case KernelKind::Gemm:
      if (w.precision == Precision::FP32) {
        if (m.gemm_fp32()) return {m.gemm_fp32()->predict(2.0 * s.m * s.n * s.k).seconds, true};
        break;
      }
      if (w.precision == Precision::BF16 && m.gemm())
        return {m.gemm()->predict({s.layout, double(s.m), double(s.n), double(s.k)}).seconds, true};
      break;
    case KernelKind::GroupedGemm:
      if (w.precision == Precision::BF16 && m.grouped())
        return {m.grouped()->predict(s).seconds, true};
      break;
    case KernelKind::Attention:
      if (w.precision == Precision::BF16 && m.attention() && m.attention()->has(s.backend))
        return {m.attention()->predict(s).seconds, true};
      break;
    case KernelKind::MemoryBound:
      if (auto it = memory_series_.find(s.op); it != memory_series_.end() && m.memory()) {
        const MemorySeries& ms = it->second;
        const double x = ms.bytes_per_token > 0 ? w.bytes / ms.bytes_per_token : w.bytes;
        const detail::MemoryBoundModel* model = ms.from_anatomy ? m.memory_anatomy() : m.memory();
        return {model->predict({ms.series, x}).seconds, true};
      }
      break;
    case KernelKind::Unspecified:
      break;
  }
  // The roofline over the best rates this GPU was measured at, never below a kernel's start-up.
  double t = m.floor_s();
  if (w.flops > 0 && m.best_flops_per_s() > 0) t = std::max(t, w.flops / m.best_flops_per_s());
  if (w.bytes > 0 && m.best_bytes_per_s() > 0) t = std::max(t, w.bytes / m.best_bytes_per_s());
  return {t, false};
}

double GpuProfile::copy_seconds(CopyDirection dir, double bytes, bool pageable) const {
  const detail::ProfileModels& m = *models_;
  if (dir == CopyDirection::DeviceToDevice) {
    // A copy within HBM reads and writes every byte: the memory table counts both.
    Work w;
    w.bytes = 2 * bytes;
    w.shape = KernelShape::memory(MemoryOp::Copy);
    return price(w).seconds;
  }
  if (!m.pcie())
    throw ConfigError(origin_ + "/profile.yaml", "tables.pcie",
                      "this profile has no PCIe table, and a copy needs one; add pcie.csv");
  detail::PcieModel::Query q{dir == CopyDirection::HostToDevice ? "h2d" : "d2h",
                             pageable ? "pageable" : "pinned", "", bytes};
  return m.pcie()->predict(q).seconds;
}

double GpuProfile::pcie_duplex_factor() const {
  return models_->pcie() ? models_->pcie()->duplex_factor() : 1.0;
}

}  // namespace nodeemu
