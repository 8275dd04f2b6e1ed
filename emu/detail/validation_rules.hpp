// The rule set behind validate(): one method per family of Megatron-Core and Megatron-Bridge
// rules, defined across validate*.cpp (pipeline and overlap rules in validate_pipeline.cpp, the
// token dispatchers' in validate_dispatcher.cpp). Internal to emu/.
#pragma once
#include <string>
#include <vector>

#include "comm/parallel_layout.hpp"
#include "devices/gpu_spec.hpp"
#include "emu/recipe.hpp"
#include "emu/recipe_keys.hpp"
#include "emu/recipe_views.hpp"
#include "emu/validate.hpp"

namespace nodeemu::emu::detail {

class Rules {
 public:
  Rules(const Recipe& r, const GpuSpec& gpu, int gpus_per_node)
      : r_(r), gpu_(gpu), gpus_per_node_(gpus_per_node) {}

  std::vector<Finding> run() {
    required();
    if (!out_.empty()) return out_;  // nothing else can be read sensibly
    layout();
    pipeline_transfers();
    ep_overlap();
    delay_wgrad();
    kernels();
    cuda_graphs();
    dispatcher();
    offload();
    recompute();
    emulator();
    optimizer();
    not_modelled();
    if (!has_errors(out_)) model();
    return out_;
  }

 private:
  void error(const std::string& key, const std::string& what) {
    out_.push_back({Finding::Level::Error, key, what});
  }
  void warning(const std::string& key, const std::string& what) {
    out_.push_back({Finding::Level::Warning, key, what});
  }
  int i(const std::string& key) const { return r_.int32(key); }
  bool b(const std::string& key) const { return r_.flag(key); }
  bool set(const std::string& key) const { return r_.is_set(key); }
  // Set to something other than the schema's default (a recipe that writes a default out
  // changes nothing by it).
  bool changed(const std::string& key) const;
  bool recompute_has(const std::string& m) const {
    return set(key::model_recompute_modules) && r_.list_has(key::model_recompute_modules, m);
  }
  bool offload_has(const std::string& m) const {
    return set(key::model_offload_modules) && r_.list_has(key::model_offload_modules, m);
  }

  void required();
  void layout();
  void microbatch_groups(std::int64_t m, int pp);
  void context_parallel(const ParallelLayout& l);
  void pipeline_transfers();
  void ep_overlap();
  void delay_wgrad();

  // ddp.overlap_grad_reduce, or Megatron-Bridge's comm_overlap.overlap_grad_reduce, which
  // overrides it (CommOverlapConfig._override_user_cfgs).
  bool overlap_grad_reduce() const { return emu::overlap_grad_reduce(r_); }

  void kernels();
  void cuda_graphs();
  void dispatcher();
  void offload();
  void recompute();
  void emulator();
  void routing();
  void attention_keys();
  void optimizer();
  void not_modelled();
  // The model's own checks (layers::ModelConfig::validate), so that a run never fails on what
  // validate passed; run last, when nothing else is wrong, to say each problem once.
  void model();

  const Recipe& r_;
  const GpuSpec& gpu_;
  int gpus_per_node_;
  std::vector<Finding> out_;
};

}  // namespace nodeemu::emu::detail
