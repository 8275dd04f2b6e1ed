#include "devices/topology.hpp"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>
#include <utility>

#include "devices/errors.hpp"
#include "devices/gpu_profile.hpp"
#include "schema/yaml_schema.hpp"

namespace nodeemu {
namespace {

using namespace schema;

// The file format, as data (schema/yaml_schema.hpp walks it).

// One of NCCL's protocols as fitted by `nodeemu comm --fit` (devices/topology.hpp, ProtocolSpec).
Field protocol_schema(const char* name) {
  return map(
      name,
      {real("base_latency_us", "the protocol's latency before its first step, us", kNonNegative),
       optional(real("bandwidth_share", "its share of the link's efficiency (1 when left out)",
                     kFraction)),
       optional(real("nic_step_us",
                     "its latency per step across nodes, us (nic.latency_us when "
                     "left out)",
                     kNonNegative))});
}

const Field& topology_schema() {
  static const Field root = map(
      "",
      {
          str("name", "topology name such as dgx_h100"),
          integer("gpus", "GPUs per node", ints(1, 64)),
          map("gpu",
              {
                  str("name", "GPU model such as H100-SXM5-80GB"),
                  integer("sms", "streaming multiprocessors", ints(1)),
                  real("bf16_tflops", "dense bf16 peak in TFLOP/s", kPositive),
                  real("fp8_tflops", "dense fp8 peak in TFLOP/s, 0 for none", kNonNegative),
                  real("fp32_tflops", "fp32 peak in TFLOP/s", kPositive),
                  // Exactly one of the two; the pair is checked after the walk.
                  optional(real("hbm_gib", "HBM capacity in GiB", kPositive)),
                  optional(real("hbm_gb", "HBM capacity in GB", kPositive)),
                  real("hbm_tb_s", "HBM bandwidth in TB/s", kPositive),
                  str("compute_capability", "\"major.minor\" such as \"9.0\""),
                  map("copy_engines",
                      {
                          integer("h2d", "host-to-device copy engines", ints(1)),
                          integer("d2h", "device-to-host copy engines", ints(1)),
                      }),
                  optional(integer("pending_launches_per_stream",
                                   "launches a stream may have pending before the host blocks "
                                   "(0: unbounded)",
                                   ints(0))),
                  str("profile",
                      "the measured GPU profile, a folder of configs/gpus/ such as h100_sxm5"),
              }),
          map("host",
              {
                  integer("sockets", "CPU sockets", ints(1)),
                  integer("cores_per_socket", "cores per socket", ints(1)),
                  int_list("numa_socket", "socket of each NUMA node", ints(0)),
                  real("numa_mem_gb_s", "DRAM bandwidth of one NUMA node in GB/s", kPositive),
                  int_list("gpu_numa", "NUMA node of each GPU", ints(0)),
              }),
          map("nvlink",
              {
                  integer("links", "NVLink links per GPU", ints(1)),
                  real("gb_s", "NVLink GB/s per direction per GPU", kPositive),
                  real("efficiency", "achievable fraction of gb_s", kFraction),
                  real("half_kb", "message KB at which half of efficiency is reached",
                       kNonNegative),
                  real("latency_us", "NVLink latency in us", kNonNegative),
                  optional(real("nvls_efficiency",
                                "achievable fraction of gb_s for an all-reduce through NVLink "
                                "SHARP (NVLS); leave out for a switch without it",
                                kFraction)),
              }),
          map("pcie",
              {
                  integer("generation", "PCIe generation", ints(1, 7)),
                  real("remote_numa_factor", "rate multiplier for far-socket memory", kFraction),
              }),
          map("nic",
              {
                  integer("per_node", "NICs in the node", ints(1)),
                  real("gb_s", "GB/s per direction per NIC", kPositive),
                  real("efficiency", "achievable fraction of gb_s", kFraction),
                  real("half_kb", "message KB at which half of efficiency is reached",
                       kNonNegative),
                  real("latency_us", "network latency in us", kNonNegative),
              }),
          optional(
              map("protocols", {optional(protocol_schema("ll")), optional(protocol_schema("ll128")),
                                optional(protocol_schema("simple"))})),
          map("comm_kernels",
              {
                  integer("nccl_sms", "SMs an NCCL-like collective kernel holds", ints(1)),
                  integer("deepep_sms", "SMs of DeepEP-like dispatch/combine (even)", ints(2)),
              }),
      });
  return root;
}

NodeTopology build(const YAML::Node& doc, const std::string& file) {
  validate(doc, topology_schema(), file);
  Reader r(doc, file);
  auto fail = [&](const std::string& key, const std::string& what) {
    throw ConfigError(file, key, line_of(r.node(key)) + what);
  };

  NodeTopology t;
  t.file = file;
  t.name = r.str("name");
  t.gpus = r.integer("gpus");

  GpuSpec& g = t.gpu;
  g.name = r.str("gpu.name");
  g.sms = r.integer("gpu.sms");
  g.bf16_flops = r.si("gpu.bf16_tflops", kTera);
  g.fp8_flops = r.si("gpu.fp8_tflops", kTera);
  g.fp32_flops = r.si("gpu.fp32_tflops", kTera);

  bool gib = r.has("gpu.hbm_gib"), gb = r.has("gpu.hbm_gb");
  if (gib && gb) fail("gpu.hbm_gb", "give only one of gpu.hbm_gib and gpu.hbm_gb");
  if (!gib && !gb) {
    throw ConfigError(file, "gpu.hbm_gib",
                      "missing required key; add gpu.hbm_gib (HBM capacity in GiB) or gpu.hbm_gb "
                      "(in GB) to 'gpu'");
  }
  // GiB scale by a power of two, which is exact in binary, so multiplying loses nothing.
  double hbm = gib ? r.si("gpu.hbm_gib", 0) * 1073741824.0 : r.si("gpu.hbm_gb", kGiga);
  const char* hbm_key = gib ? "gpu.hbm_gib" : "gpu.hbm_gb";
  // Range first: llround of a value past long long is undefined.
  if (hbm >= 0x1p62 || std::llround(hbm) < 1) {
    fail(hbm_key, "HBM capacity rounds to no bytes or is absurdly large; give it in GiB or GB");
  }
  g.hbm_bytes = static_cast<std::uint64_t>(std::llround(hbm));
  g.hbm_bytes_per_s = r.si("gpu.hbm_tb_s", kTera);

  {
    const std::string cc = r.str("gpu.compute_capability");
    // Digits only on each side: "9.0" and "10.0", never "9" or "+9.-1".
    auto digits = [](std::string_view v) {
      return !v.empty() && v.size() <= 2 && v.find_first_not_of("0123456789") == v.npos;
    };
    size_t dot = cc.find('.');
    long long major = 0, minor = 0;
    if (dot == std::string::npos || !digits(std::string_view(cc).substr(0, dot)) ||
        !digits(std::string_view(cc).substr(dot + 1)) ||
        !parse_int(std::string_view(cc).substr(0, dot), major) ||
        !parse_int(std::string_view(cc).substr(dot + 1), minor) || major < 1) {
      fail("gpu.compute_capability", "expected \"major.minor\" such as \"9.0\", got " +
                                         describe_node(r.node("gpu.compute_capability")));
    }
    g.cc_major = static_cast<int>(major);
    g.cc_minor = static_cast<int>(minor);
  }

  g.h2d_copy_engines = r.integer("gpu.copy_engines.h2d");
  g.d2h_copy_engines = r.integer("gpu.copy_engines.d2h");
  if (r.has("gpu.pending_launches_per_stream"))
    g.pending_launches_per_stream = r.integer("gpu.pending_launches_per_stream");
  // The measured price list: kernel and copy times, host costs and contention.
  g.use_profile(GpuProfile::resolve(r.str("gpu.profile"), file));

  HostSpec& h = t.host;
  h.sockets = r.integer("host.sockets");
  h.cores_per_socket = r.integer("host.cores_per_socket");
  h.numa_socket = r.int_list("host.numa_socket");
  h.numa_mem_bytes_per_s = r.si("host.numa_mem_gb_s", kGiga);
  h.gpu_numa = r.int_list("host.gpu_numa");
  for (size_t i = 0; i < h.numa_socket.size(); ++i) {
    if (h.numa_socket[i] >= h.sockets) {
      fail("host.numa_socket", "entry " + std::to_string(i) + " is socket " +
                                   std::to_string(h.numa_socket[i]) + " but host.sockets is " +
                                   std::to_string(h.sockets) + "; use 0.." +
                                   std::to_string(h.sockets - 1));
    }
  }
  if (static_cast<int>(h.gpu_numa.size()) != t.gpus) {
    fail("host.gpu_numa", "has " + std::to_string(h.gpu_numa.size()) + " entries but gpus is " +
                              std::to_string(t.gpus) + "; give the NUMA node of every GPU");
  }
  for (size_t i = 0; i < h.gpu_numa.size(); ++i) {
    if (h.gpu_numa[i] >= h.numa_count()) {
      fail("host.gpu_numa", "entry " + std::to_string(i) + " is NUMA node " +
                                std::to_string(h.gpu_numa[i]) + " but host.numa_socket defines " +
                                std::to_string(h.numa_count()) + "; use 0.." +
                                std::to_string(h.numa_count() - 1));
    }
  }

  t.nvlink.links = r.integer("nvlink.links");
  t.nvlink.bytes_per_s = r.si("nvlink.gb_s", kGiga);
  t.nvlink.efficiency = r.si("nvlink.efficiency", 0);
  t.nvlink.half_bytes = r.si("nvlink.half_kb", kKilo);
  t.nvlink.latency_s = r.si("nvlink.latency_us", kMicro);
  if (r.has("nvlink.nvls_efficiency")) t.nvlink.nvls_efficiency = r.si("nvlink.nvls_efficiency", 0);

  t.pcie.generation = r.integer("pcie.generation");
  t.pcie.remote_numa_factor = r.si("pcie.remote_numa_factor", 0);

  t.nic.per_node = r.integer("nic.per_node");
  t.nic.bytes_per_s = r.si("nic.gb_s", kGiga);
  t.nic.efficiency = r.si("nic.efficiency", 0);
  t.nic.half_bytes = r.si("nic.half_kb", kKilo);
  t.nic.latency_s = r.si("nic.latency_us", kMicro);

  t.comm.nccl_sms = r.integer("comm_kernels.nccl_sms");
  t.comm.deepep_sms = r.integer("comm_kernels.deepep_sms");
  // Without a protocols map, one protocol at the links' own figures.
  if (!r.has("protocols")) {
    t.protocols = {{"simple", 0, 1, t.nic.latency_s}};
  } else {
    for (const char* name : {"ll", "ll128", "simple"}) {
      const std::string at = std::string("protocols.") + name;
      if (!r.has(at)) continue;
      ProtocolSpec p{name, r.si(at + ".base_latency_us", kMicro), 1, t.nic.latency_s};
      if (r.has(at + ".bandwidth_share")) p.bandwidth_share = r.si(at + ".bandwidth_share", 0);
      if (r.has(at + ".nic_step_us")) p.nic_step_s = r.si(at + ".nic_step_us", kMicro);
      t.protocols.push_back(p);
    }
    // Point-to-point calls (all-to-all, send/recv) run Simple: it is the one every map has.
    if (t.protocols.empty() || t.protocols.back().name != "simple")
      fail("protocols",
           "has no simple protocol; give protocols.simple (NCCL's point-to-point "
           "calls run it), or leave the map out");
  }
  const std::pair<const char*, int> comm_sms[] = {{"comm_kernels.nccl_sms", t.comm.nccl_sms},
                                                  {"comm_kernels.deepep_sms", t.comm.deepep_sms}};
  for (const auto& [key, v] : comm_sms)
    if (v > t.gpu.sms)
      fail(key, std::to_string(v) + " is more SMs than the GPU has (" + std::to_string(t.gpu.sms) +
                    "); use at most gpu.sms");
  if (t.comm.deepep_sms % 2 != 0)
    fail("comm_kernels.deepep_sms", std::to_string(t.comm.deepep_sms) +
                                        " is odd; DeepEP forms num_sms/2 channels, use an "
                                        "even number such as 20");
  return t;
}

}  // namespace

NodeTopology NodeTopology::from_file(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    throw ConfigError(path, "file",
                      "no such file; pass a topology YAML such as "
                      "configs/topologies/dgx_h100.yaml");
  }
  if (fs::is_directory(path, ec)) {
    throw ConfigError(path, "file", "is a directory; pass a topology YAML file");
  }
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  if (in) text << in.rdbuf();
  if (!in || in.bad()) {
    throw ConfigError(path, "file", "cannot be read; check its permissions");
  }
  return from_yaml(text.str(), path);
}

NodeTopology NodeTopology::from_yaml(const std::string& text, const std::string& file_for_errors) {
  return build(load_document(text, file_for_errors, "a topology map starting with 'name:'"),
               file_for_errors);
}

}  // namespace nodeemu
