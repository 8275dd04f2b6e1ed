#include "devices/topology.hpp"

#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "devices/errors.hpp"

#ifndef NODEEMU_SOURCE_DIR
#define NODEEMU_SOURCE_DIR "."
#endif

namespace nodeemu {
namespace {

std::string topology_path(const std::string& name) {
  return std::string(NODEEMU_SOURCE_DIR) + "/configs/topologies/" + name + ".yaml";
}

// A complete, valid topology kept here rather than read from configs/, so that retuning a
// shipped figure never breaks the error tests that edit this text.
const char* const kValid = R"(name: test_node
gpus: 8
gpu:
  name: H100-SXM5-80GB
  sms: 132
  bf16_tflops: 989
  fp8_tflops: 1979
  fp32_tflops: 67
  hbm_gib: 80
  hbm_tb_s: 3.35
  compute_capability: "9.0"
  profile: h100_sxm5
  copy_engines: {h2d: 1, d2h: 1}
host:
  sockets: 2
  cores_per_socket: 56
  numa_socket: [0, 1]
  numa_mem_gb_s: 300
  gpu_numa: [0, 0, 0, 0, 1, 1, 1, 1]
nvlink: {links: 18, gb_s: 450, efficiency: 0.85, half_kb: 512, latency_us: 1.0}
pcie: {generation: 5, remote_numa_factor: 0.8}
nic: {per_node: 8, gb_s: 50, efficiency: 0.97, half_kb: 128, latency_us: 2.0}
comm_kernels: {nccl_sms: 24, deepep_sms: 20}
)";

const char* const kFile = "inline.yaml";

// kValid with one exact piece of text replaced; fails the test if the piece is not there, so a
// typo in a test cannot silently test the valid file.
std::string edited(const std::string& from, const std::string& to) {
  std::string s = kValid;
  size_t at = s.find(from);
  EXPECT_NE(at, std::string::npos) << "test text not found: " << from;
  if (at != std::string::npos) s.replace(at, from.size(), to);
  return s;
}

// Loads `text` expecting a ConfigError on `key` whose message holds every one of `parts`.
void expect_error(const std::string& text, const std::string& key,
                  const std::vector<std::string>& parts) {
  try {
    NodeTopology::from_yaml(text, kFile);
    ADD_FAILURE() << "no ConfigError; expected one on key " << key;
  } catch (const ConfigError& e) {
    std::string what = e.what();
    EXPECT_EQ(e.file(), kFile);
    EXPECT_EQ(e.key(), key) << what;
    EXPECT_EQ(what.rfind(std::string(kFile) + ": " + key + ": ", 0), 0u) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    for (const std::string& p : parts) EXPECT_NE(what.find(p), std::string::npos) << what;
  }
}

TEST(Topology, InlineBaseIsValid) {
  EXPECT_NO_THROW(NodeTopology::from_yaml(kValid, kFile));
}

TEST(Topology, EveryShippedFileLoads) {
  for (const char* name : {"dgx_h100", "dgx_h200", "hgx_a100", "dgx_b200"}) {
    SCOPED_TRACE(name);
    const std::string path = topology_path(name);
    NodeTopology t;
    ASSERT_NO_THROW(t = NodeTopology::from_file(path));
    EXPECT_EQ(t.name, name);
    EXPECT_EQ(t.file, path);
    EXPECT_EQ(t.gpus, 8);
    EXPECT_EQ(static_cast<int>(t.host.gpu_numa.size()), t.gpus);
    EXPECT_EQ(t.host.numa_count(), 2);
    EXPECT_EQ(t.host.sockets, 2);
    EXPECT_GT(t.gpu.bf16_flops, 0);
    EXPECT_GT(t.gpu.hbm_bytes, 0u);
    EXPECT_GT(t.nvlink.bytes_per_s, 0);
    EXPECT_GT(t.nic.bytes_per_s, 0);
  }
}

// The fabric takes its HBM share first, up to its max-min fair share beside the memory-bound
// kernels (detail/shared_resources.hpp). The engine does not slow the flows for HBM, which is
// exact while a GPU's links at full rate both ways (its NVLink port and its share of its NICs)
// move less than a third of its HBM bandwidth: the fair share beside two memory-bound kernels.
TEST(Topology, TheFabricNeverWantsMoreThanItsFairShareOfHbm) {
  for (const char* name : {"dgx_h100", "dgx_h200", "hgx_a100", "dgx_b200"}) {
    SCOPED_TRACE(name);
    const NodeTopology t = NodeTopology::from_file(topology_path(name));
    const double nics_per_gpu = static_cast<double>(t.nic.per_node) / t.gpus;
    const double most = 2 * (t.nvlink.bytes_per_s + nics_per_gpu * t.nic.bytes_per_s);
    EXPECT_LT(most / t.gpu.hbm_bytes_per_s, 1.0 / 3);
  }
}

TEST(Topology, DgxH100FiguresComeThroughInSiUnits) {
  const NodeTopology t = NodeTopology::from_file(topology_path("dgx_h100"));
  EXPECT_EQ(t.name, "dgx_h100");
  EXPECT_EQ(t.gpus, 8);

  const GpuSpec& g = t.gpu;
  EXPECT_EQ(g.name, "H100-SXM5-80GB");
  EXPECT_EQ(g.sms, 132);
  // Exact equality on purpose: unit scaling is done in decimal, so each value is the double
  // nearest the SI figure as written.
  EXPECT_EQ(g.bf16_flops, 989e12);
  EXPECT_EQ(g.fp8_flops, 1979e12);
  EXPECT_EQ(g.fp32_flops, 67e12);
  EXPECT_EQ(g.hbm_bytes, 80ull << 30);
  EXPECT_EQ(g.hbm_bytes_per_s, 3.35e12);
  EXPECT_EQ(g.cc_major, 9);
  EXPECT_EQ(g.cc_minor, 0);
  EXPECT_EQ(g.h2d_copy_engines, 1);
  EXPECT_EQ(g.d2h_copy_engines, 1);
  // Host costs come from the measured profile's host_costs.csv (eager PyTorch on the GPU box).
  ASSERT_TRUE(g.profile);
  EXPECT_EQ(g.profile->name(), "h100_sxm5");
  EXPECT_TRUE(g.profile->measured());
  EXPECT_EQ(g.kernel_launch_host_s, 7.133e-6);   // torch_add_host_per_launch
  EXPECT_EQ(g.memcpy_launch_host_s, 7.133e-6);   // a copy is one eager op too
  EXPECT_EQ(g.event_record_host_s, 5.573e-6);    // event_record_host
  EXPECT_EQ(g.stream_wait_host_s, 9.152e-7);     // stream_wait_event_host
  EXPECT_EQ(g.sync_host_s, 6.338e-6);            // sync_idle
  EXPECT_EQ(g.graph_kernel_host_s, 2.208e-8);    // graph_replay_per_kernel
  EXPECT_EQ(g.small_d2h_sync_host_s, 1.298e-5);  // small_d2h_host_sync_128_int64
  // launch_plus_sync_roundtrip - launch - sync - the smallest kernel measured (1.3712 us)
  EXPECT_NEAR(g.launch_latency_s, 1.612e-5 - 7.133e-6 - 6.338e-6 - 1.3712e-6, 1e-12);
  // Contention from sm_contention.csv and overlap_contention.csv.
  EXPECT_NEAR(g.contention.with_sms_held(32.0 / 132), 1.141, 1e-9);
  EXPECT_NEAR(g.contention.with_sms_held(66.0 / 132), 1.58, 1e-9);
  EXPECT_EQ(g.contention.compute_beside_memory, 1.149);
  EXPECT_EQ(g.contention.memory_beside_compute, 2.071);
  // Measured 0.9979 (PCIe copies cost this GEMM nothing): read as none, never a speed-up.
  EXPECT_EQ(g.contention.compute_beside_pcie, 1.0);

  EXPECT_EQ(t.host.sockets, 2);
  EXPECT_EQ(t.host.cores_per_socket, 56);
  EXPECT_EQ(t.host.numa_socket, (std::vector<int>{0, 1}));
  EXPECT_EQ(t.host.numa_mem_bytes_per_s, 300e9);
  EXPECT_EQ(t.host.gpu_numa, (std::vector<int>{0, 0, 0, 0, 1, 1, 1, 1}));

  EXPECT_EQ(t.nvlink.links, 18);
  EXPECT_EQ(t.nvlink.bytes_per_s, 450e9);
  EXPECT_EQ(t.nvlink.efficiency, 0.8005);
  EXPECT_EQ(t.nvlink.latency_s, 1.0e-6);
  EXPECT_EQ(t.nvlink.nvls_efficiency, 0.558);

  EXPECT_EQ(t.pcie.generation, 5);
  EXPECT_EQ(t.pcie.remote_numa_factor, 0.41);

  EXPECT_EQ(t.nic.per_node, 8);
  EXPECT_EQ(t.nic.bytes_per_s, 50e9);
  EXPECT_EQ(t.nic.efficiency, 0.9419);
  EXPECT_EQ(t.nic.latency_s, 2.0e-6);

  // NCCL's protocols, fitted with the links' figures (tests/emu/fabric_fit_test.cpp).
  ASSERT_EQ(t.protocols.size(), 3u);
  EXPECT_EQ(t.protocols[0].name, "ll");
  EXPECT_NEAR(t.protocols[0].base_latency_s, 22.09e-6, 1e-15);
  EXPECT_EQ(t.protocols[0].bandwidth_share, 0.123);
  EXPECT_NEAR(t.protocols[0].nic_step_s, 6.138e-6, 1e-15);
  EXPECT_EQ(t.protocols[2].name, "simple");
  EXPECT_EQ(t.protocols[2].bandwidth_share, 1);
}

TEST(Topology, AProtocolsMapWithoutSimpleIsRefusedAndNoMapIsOneProtocol) {
  const std::string base = R"(name: t
gpus: 1
gpu: {name: g, sms: 132, bf16_tflops: 989, fp8_tflops: 0, fp32_tflops: 67, hbm_gib: 80,
      hbm_tb_s: 3.35, compute_capability: "9.0", copy_engines: {h2d: 1, d2h: 1},
      profile: h100_sxm5}
host: {sockets: 1, cores_per_socket: 4, numa_socket: [0], numa_mem_gb_s: 100, gpu_numa: [0]}
nvlink: {links: 18, gb_s: 450, efficiency: 0.8, half_kb: 0, latency_us: 1}
pcie: {generation: 5, remote_numa_factor: 0.8}
nic: {per_node: 1, gb_s: 50, efficiency: 0.9, half_kb: 0, latency_us: 2}
comm_kernels: {nccl_sms: 24, deepep_sms: 20}
)";
  const NodeTopology plain = NodeTopology::from_yaml(base, "t.yaml");
  ASSERT_EQ(plain.protocols.size(), 1u);
  EXPECT_EQ(plain.protocols[0].name, "simple");
  EXPECT_EQ(plain.protocols[0].base_latency_s, 0);
  EXPECT_EQ(plain.protocols[0].nic_step_s, 2e-6);
  EXPECT_EQ(plain.nvlink.nvls_efficiency, 0) << "no NVLS unless the topology says so";
  try {
    NodeTopology::from_yaml(base + "protocols: {ll: {base_latency_us: 5}}\n", "t.yaml");
    FAIL() << "a protocols map without simple was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("protocols.simple"), std::string::npos) << e.what();
  }
}

TEST(Topology, OtherShippedFigures) {
  const NodeTopology h200 = NodeTopology::from_file(topology_path("dgx_h200"));
  EXPECT_EQ(h200.gpu.bf16_flops, 989e12);
  EXPECT_EQ(h200.gpu.hbm_bytes, 141'000'000'000ull);  // hbm_gb: decimal gigabytes
  EXPECT_EQ(h200.gpu.hbm_bytes_per_s, 4.8e12);

  const NodeTopology a100 = NodeTopology::from_file(topology_path("hgx_a100"));
  EXPECT_EQ(a100.gpu.sms, 108);
  EXPECT_EQ(a100.gpu.fp8_flops, 0);
  EXPECT_EQ(a100.gpu.fp32_flops, 19.5e12);
  EXPECT_EQ(a100.gpu.hbm_bytes_per_s, 2.039e12);
  EXPECT_EQ(a100.gpu.cc_major, 8);
  EXPECT_EQ(a100.nvlink.links, 12);
  EXPECT_EQ(a100.nvlink.bytes_per_s, 300e9);
  EXPECT_EQ(a100.pcie.generation, 4);
  EXPECT_EQ(a100.nic.bytes_per_s, 25e9);

  const NodeTopology b200 = NodeTopology::from_file(topology_path("dgx_b200"));
  EXPECT_EQ(b200.gpu.sms, 148);
  EXPECT_EQ(b200.gpu.cc_major, 10);
  EXPECT_EQ(b200.gpu.cc_minor, 0);
  EXPECT_EQ(b200.gpu.hbm_bytes, 180'000'000'000ull);
  EXPECT_EQ(b200.gpu.hbm_bytes_per_s, 8e12);
  EXPECT_EQ(b200.nvlink.bytes_per_s, 900e9);
}

TEST(Topology, UnknownKeySuggestsNearestValidKey) {
  expect_error(edited("hbm_tb_s: 3.35", "hbm_tbs: 3.35"), "gpu.hbm_tbs",
               {"unknown key", "line 10: unknown key", "did you mean 'gpu.hbm_tb_s'?"});
  expect_error(edited("nvlink:", "nvlnk:"), "nvlnk", {"did you mean 'nvlink'?"});
  expect_error(edited("  profile:", "  profil:"), "gpu.profil", {"did you mean 'gpu.profile'?"});
  // A correctly spelled key one level too high points at where it belongs.
  expect_error(edited("  compute_capability:", "  h2d: 1\n  compute_capability:"), "gpu.h2d",
               {"did you mean 'gpu.copy_engines.h2d'?"});
}

TEST(Topology, ProfileIsResolvedOrNamed) {
  expect_error(edited("profile: h100_sxm5", "profile: h900"), "gpu.profile",
               {"no GPU profile 'h900'", "h100_sxm5", "tools/measure_gpu.py"});
  expect_error(edited("  profile: h100_sxm5\n", ""), "gpu.profile", {"missing required key"});
  // The shipped topologies name measured profiles (H100, H200) or derived ones, and say which.
  for (const auto& [topo, profile, measured] :
       std::vector<std::tuple<const char*, const char*, bool>>{{"dgx_h100", "h100_sxm5", true},
                                                               {"dgx_h200", "h200_sxm", true},
                                                               {"dgx_b200", "b200_sxm", false},
                                                               {"hgx_a100", "a100_sxm4", false}}) {
    SCOPED_TRACE(topo);
    const NodeTopology t = NodeTopology::from_file(topology_path(topo));
    ASSERT_TRUE(t.gpu.profile);
    EXPECT_EQ(t.gpu.profile->name(), profile);
    EXPECT_EQ(t.gpu.profile->measured(), measured);
    EXPECT_NE(t.gpu.profile->provenance().find(measured ? "measured on" : "derived, not measured"),
              std::string::npos);
  }
}

TEST(Topology, UnknownKeyWithNothingCloseListsValidKeys) {
  expect_error(edited("  sockets: 2", "  sockets: 2\n  zzzzzzzz: 1"), "host.zzzzzzzz",
               {"unknown key", "valid keys in 'host' are", "gpu_numa"});
}

TEST(Topology, MissingKeyIsNamed) {
  expect_error(edited("  sms: 132\n", ""), "gpu.sms", {"missing required key", "integer"});
  expect_error(edited("nic: {per_node: 8, gb_s: 50, efficiency: 0.97, half_kb: 128, latency_us: "
                      "2.0}\n",
                      ""),
               "nic", {"missing required key"});
  expect_error(edited("{links: 18, gb_s: 450,", "{links: 18,"), "nvlink.gb_s",
               {"missing required key", "GB/s"});
}

TEST(Topology, WrongTypeNamesExpectedType) {
  expect_error(edited("sms: 132", "sms: many"), "gpu.sms", {"expected an integer", "'many'"});
  expect_error(edited("sms: 132", "sms: 132.5"), "gpu.sms", {"expected an integer"});
  expect_error(edited("bf16_tflops: 989", "bf16_tflops: fast"), "gpu.bf16_tflops",
               {"expected a number", "'fast'"});
  // Quoted means string, even when it looks like a number.
  expect_error(edited("bf16_tflops: 989", "bf16_tflops: \"989\""), "gpu.bf16_tflops",
               {"expected a number", "the string '989'", "remove the quotes"});
  expect_error(edited("gpu_numa: [0, 0, 0, 0, 1, 1, 1, 1]", "gpu_numa: {a: 0}"), "host.gpu_numa",
               {"expected a list of integers", "got a map"});
  expect_error(edited("gpu_numa: [0, 0, 0, 0, 1, 1, 1, 1]", "gpu_numa: [0, 0, 0, x, 1, 1, 1, 1]"),
               "host.gpu_numa", {"entry 3", "integer", "'x'"});
  expect_error(edited("copy_engines: {h2d: 1, d2h: 1}", "copy_engines: [1, 1]"), "gpu.copy_engines",
               {"expected a map", "got a list"});
  expect_error(edited("  sms: 132", "  sms:"), "gpu.sms", {"expected an integer", "got nothing"});
  expect_error(edited("name: test_node", "name: [a, b]"), "name", {"expected a string"});
}

TEST(Topology, OutOfRangeValuesAreNamed) {
  expect_error(edited("gpus: 8", "gpus: 0"), "gpus", {"must be in [1, 64]", "'0'"});
  expect_error(edited("gpus: 8", "gpus: 65"), "gpus", {"must be in [1, 64]"});
  expect_error(edited("hbm_tb_s: 3.35", "hbm_tb_s: -3"), "gpu.hbm_tb_s", {"must be > 0"});
  expect_error(edited("sms: 132", "sms: 0"), "gpu.sms", {"must be >= 1"});
  expect_error(edited("{links: 18, gb_s: 450, efficiency: 0.85",
                      "{links: 18, gb_s: 450, "
                      "efficiency: 1.2"),
               "nvlink.efficiency", {"must be in (0, 1]", "'1.2'"});
  expect_error(edited("efficiency: 0.97", "efficiency: 0"), "nic.efficiency",
               {"must be in (0, 1]"});
  expect_error(edited("remote_numa_factor: 0.8", "remote_numa_factor: 1.5"),
               "pcie.remote_numa_factor", {"must be in (0, 1]"});
  expect_error(edited("fp8_tflops: 1979", "fp8_tflops: -1"), "gpu.fp8_tflops", {"must be >= 0"});
  expect_error(edited("hbm_tb_s: 3.35", "hbm_tb_s: inf"), "gpu.hbm_tb_s", {"expected a number"});
}

TEST(Topology, GpuNumaMustMatchGpusAndNumaNodes) {
  expect_error(edited("gpu_numa: [0, 0, 0, 0, 1, 1, 1, 1]", "gpu_numa: [0, 0, 0, 0, 1, 1, 1]"),
               "host.gpu_numa", {"has 7 entries", "gpus is 8"});
  expect_error(edited("gpu_numa: [0, 0, 0, 0, 1, 1, 1, 1]", "gpu_numa: [0, 0, 0, 0, 1, 1, 1, 2]"),
               "host.gpu_numa", {"entry 7", "NUMA node 2", "0..1"});
  expect_error(edited("gpu_numa: [0, 0, 0, 0, 1, 1, 1, 1]", "gpu_numa: [0, 0, 0, 0, 1, 1, 1, -1]"),
               "host.gpu_numa", {"entry 7", ">= 0"});
  expect_error(edited("numa_socket: [0, 1]", "numa_socket: [0, 2]"), "host.numa_socket",
               {"entry 1", "socket 2", "host.sockets is 2"});
}

TEST(Topology, HbmCapacityNeedsExactlyOneUnit) {
  expect_error(edited("  hbm_gib: 80\n", ""), "gpu.hbm_gib", {"missing", "gpu.hbm_gb"});
  expect_error(edited("  hbm_gib: 80\n", "  hbm_gib: 80\n  hbm_gb: 85\n"), "gpu.hbm_gb",
               {"only one"});
  const NodeTopology t =
      NodeTopology::from_yaml(edited("  hbm_gib: 80\n", "  hbm_gb: 80\n"), kFile);
  EXPECT_EQ(t.gpu.hbm_bytes, 80'000'000'000ull);
}

TEST(Topology, ComputeCapabilityIsMajorDotMinor) {
  expect_error(edited("\"9.0\"", "\"9\""), "gpu.compute_capability", {"major.minor", "'9'"});
  expect_error(edited("\"9.0\"", "\"9.x\""), "gpu.compute_capability", {"major.minor"});
  EXPECT_EQ(NodeTopology::from_yaml(edited("\"9.0\"", "\"10.3\""), kFile).gpu.cc_minor, 3);
}

TEST(Topology, DuplicateKeyIsRejected) {
  expect_error(edited("  sms: 132\n", "  sms: 132\n  sms: 100\n"), "gpu.sms",
               {"given twice", "keep one"});
}

TEST(Topology, YamlSyntaxErrorGivesLineAndColumn) {
  expect_error(edited("numa_socket: [0, 1]", "numa_socket: [0, 1"), "yaml",
               {"line ", ", column ", "fix the YAML syntax"});
  expect_error("", "yaml", {"empty"});
  expect_error("- just\n- a list\n", "yaml", {"expected a map", "got a list"});
  expect_error(std::string(kValid) + "---\n" + kValid, "yaml", {"2 documents"});
}

TEST(Topology, MissingFileIsNamed) {
  const std::string path = topology_path("no_such_topology");
  try {
    NodeTopology::from_file(path);
    FAIL() << "no ConfigError for a missing file";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.file(), path);
    EXPECT_EQ(e.key(), "file");
    EXPECT_NE(std::string(e.what()).find("no such file"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
  }
  try {
    NodeTopology::from_file(std::string(NODEEMU_SOURCE_DIR) + "/configs/topologies");
    FAIL() << "no ConfigError for a directory";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.key(), "file");
    EXPECT_NE(std::string(e.what()).find("directory"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace nodeemu
