// Internal to emu: what each rank of a run hands back (training.cpp fills it, run_report.cpp
// turns it into the RunReport), and the hash the numerics are summed into.
#pragma once

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

namespace nodeemu::emu::detail {

// FNV-1a, 64 bits: the numerics hash is over exact bytes.
struct Fnv {
  std::uint64_t h = 1469598103934665603ull;
  void add(const void* data, std::size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  }
  template <class T>
  void add(const T& v) {
    add(&v, sizeof v);
  }
};

// One parameter's gradient after the data-parallel reduction: dense weights from the DP x CP
// ranks that hold it reduced (rank 0, or each its shard with the distributed optimizer), expert
// weights likewise over expert DP (one digest per EP shard). Layouts that differ only in
// pipelining or in the optimizer give the same set.
struct GradDigest {
  int iter;
  std::string name;
  int shard;
  std::uint64_t hash;  // a partial element_checksum: the records of one key add up
  bool operator<(const GradDigest& o) const {
    return std::tie(iter, name, shard) < std::tie(o.iter, o.name, o.shard);
  }
};

struct RankResult {
  std::vector<double> end_s;      // virtual time at the end of each iteration
  std::vector<double> loss;       // this rank's share of each iteration's loss (last stage only)
  std::vector<double> mtp_loss;   // the same for the MTP loss
  std::vector<double> grad_norm;  // each iteration's global gradient norm (functional only)
  std::vector<GradDigest> digests;
  std::uint64_t peak_mem = 0, parameters = 0, optimizer_state = 0;
  int reruns = 0;  // steps run twice: the sync-free budget dropped pairs on some rank
  std::vector<std::uint64_t> offload_bytes;  // per iteration
  int host_real_numa = -1;
  std::uint64_t pinned_host_bytes = 0;
  std::string host_cpus;
};

}  // namespace nodeemu::emu::detail
