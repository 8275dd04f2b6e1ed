// A GPU profile: the timing plane's price list, measured on a real GPU (configs/gpus/<name>/).
// A profile is a folder of measured tables (GEMMs, grouped GEMMs, attention, memory-bound kernels,
// PCIe copies, host costs, SM and HBM contention), their provenance (README.md) and profile.yaml,
// which says what the tables are. A topology names its profile (`gpu.profile: h100_sxm5`); the
// datasheet figures in the topology stay as asymptotes only.
//
// A profile for a GPU nobody measured is derived from a measured one by datasheet ratios
// (`derived:` in its YAML) and says so wherever it is shown.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "devices/grouped_tiling.hpp"
#include "devices/work.hpp"

namespace nodeemu {

namespace detail {
class ProfileModels;
}

// Host time of eager PyTorch calls, measured on the GPU box's CPU (host_costs.csv).
struct HostCosts {
  double launch_s = 0;          // one launched op (a kernel or a copy)
  double event_record_s = 0;    // torch.cuda.Event.record
  double stream_wait_s = 0;     // Stream.wait_event
  double synchronize_s = 0;     // a synchronize's own cost, on top of waiting for the device
  double graph_kernel_s = 0;    // each kernel replayed inside a CUDA graph
  double small_d2h_sync_s = 0;  // a small D2H copy read on the host (.tolist()), GPU idle
  // Device-side delay from the end of a launch to the earliest start: the launch + synchronize
  // round trip less the launch, the synchronize and the smallest kernel (never below 0).
  double launch_latency_s = 0;
  // Host time per kernel of an eager layer as the framework issues it (Python, the dispatcher,
  // autograd's recording in forward, the autograd engine's per-node work in backward, the
  // launch): host_ops.csv's layer rows, host seconds over the kernels they launched. 0: the
  // profile has no such table (a launch then costs launch_s in every pass).
  double forward_kernel_s = 0;
  double backward_kernel_s = 0;
};

// How kernels sharing a GPU slow each other down, as measured (sm_contention.csv,
// overlap_contention.csv). All factors are slowdowns (>= 1) of a kernel's time when alone.
struct Contention {
  // (fraction of the SMs held by another kernel, slowdown of a GEMM), in increasing fraction.
  // Holding SMs slows a GEMM far less than in proportion (clocks rise when fewer SMs work).
  std::vector<std::pair<double, double>> sm_held;
  double compute_beside_memory = 1;  // a GEMM while a memory-bound kernel runs beside it
  double memory_beside_compute = 1;  // that memory-bound kernel
  double compute_beside_pcie = 1;    // a GEMM while PCIe copies run
  // A GEMM's slowdown while the fabric moves a `share` of the GPU's HBM bandwidth (datasheet)
  // through its memory: the measured GEMM-beside-copy slowdown in proportion to the HBM share
  // the copy kernel had then (1 / memory_beside_compute of its rate alone, which is HBM's).
  double compute_beside_hbm_share(double share) const;
  // The slowdown with `fraction` of the SMs held. Between measured points: linear; below the
  // first: from none to the first point; above the last point (f_l, s_l): s_l (1 - f_l) /
  // (1 - fraction), which grows without bound as the SMs left shrink, in proportion to them as
  // sharing would (but from the measured level). Without a table: proportional sharing.
  double with_sms_held(double fraction) const;
};

struct KernelPrice {
  double seconds = 0;
  bool from_table = false;  // false: no table prices this kernel; the roofline fallback did
};

enum class CopyDirection { HostToDevice, DeviceToHost, DeviceToDevice };

// One measured row predicted from all the others.
struct LooRow {
  std::size_t row = 0;  // 1-based, as `where` counts
  std::string where;    // "row 17 (line 18)"
  double measured = 0, predicted = 0;
  double error() const;  // |predicted / measured - 1|
};

// One table's leave-one-out error: each measured row predicted from all the others.
struct LooStats {
  std::string table, column;
  std::size_t rows = 0;
  double median = 0, p90 = 0, max = 0;  // absolute relative errors
  std::vector<LooRow> per_row;          // in the table's order; the worst is where `max` is
};

// What `nodeemu cost` writes: the table's rows with the predicted times (and rates), and per row
// the measured points each prediction came from.
struct TablePrediction {
  std::string kind;  // "gemm", "grouped_gemm", ...
  std::string csv;
  std::vector<std::string> explanations;
};

class GpuProfile {
 public:
  // Loads the profile folder `dir`. A derived profile finds its base beside it (../<base>) or
  // among the built-in ones. Throws ConfigError naming the file and the key, or the table's row
  // and column.
  static std::shared_ptr<const GpuProfile> load(const std::string& dir);
  // A profile compiled into the binary (every folder of configs/gpus/), or null.
  static std::shared_ptr<const GpuProfile> builtin(const std::string& name);
  static std::vector<std::string> builtin_names();
  // The profile a topology names: a name looks in `<topology's folder>/../gpus/<name>` and then
  // among the built-in profiles; a value with a '/' is a folder relative to the topology's.
  static std::shared_ptr<const GpuProfile> resolve(const std::string& value,
                                                   const std::string& topology_file);

  ~GpuProfile();
  const std::string& name() const { return name_; }
  const std::string& gpu() const { return gpu_; }  // the GPU as the measurement named it
  bool measured() const { return measured_; }
  bool complete() const { return complete_; }
  int sms() const { return sms_; }                       // of the measured GPU
  const std::string& origin() const { return origin_; }  // folder, or "<built-in>"
  // One line: "h100_sxm5: measured on NVIDIA H100 80GB HBM3 (...)", or "derived, not measured".
  const std::string& provenance() const { return provenance_; }
  const HostCosts& host_costs() const { return host_; }
  const Contention& contention() const { return contention_; }
  double kernel_floor_s() const;
  // How the grouped table's kernel tiles (a derived profile's is its base's); none: unknown.
  std::optional<GroupedTiling> grouped_tiling() const;

  // The kernel's time with the whole GPU to itself, from the table of its shape. A kernel with no
  // shape, or one whose table the profile lacks, is priced by the roofline over the profile's
  // best measured rates (never the datasheet's) and comes back with from_table = false.
  KernelPrice price(const Work& w) const;
  // A copy's time through its copy engine, alone: PCIe by direction, pinned or pageable host
  // memory and size; within the device as the memory-bound 'copy' series.
  double copy_seconds(CopyDirection dir, double bytes, bool pageable) const;
  // Each PCIe direction's rate multiplier while the other also runs (measured; 1 if not).
  double pcie_duplex_factor() const;

  // Every measured table's leave-one-out errors (calibration/README: the method).
  std::vector<LooStats> leave_one_out() const;
  // Predicts each row of a table in a profile table's format (the time and rate columns may be
  // missing); `file` names it in messages. Throws ConfigError for an unknown header or bad row.
  TablePrediction predict_table(const std::string& csv_text, const std::string& file) const;

 private:
  GpuProfile();
  friend struct ProfileLoader;
  std::string name_, gpu_, origin_, provenance_;
  bool measured_ = true, complete_ = false;
  int sms_ = 0;
  HostCosts host_;
  Contention contention_;
  // Which measured series prices each memory-bound kernel class, and the bytes a token stands
  // for in a series measured by tokens (0: measured by bytes).
  struct MemorySeries {
    std::string series;
    double bytes_per_token = 0;
    bool from_anatomy = false;  // memory_anatomy.csv's, read from a layer trace, not a table
  };
  std::map<MemoryOp, MemorySeries> memory_series_;
  std::unique_ptr<detail::ProfileModels> models_;
};

}  // namespace nodeemu
