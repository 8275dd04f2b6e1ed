// The tensors one layer keeps from forward for backward, each passing through the activation
// hooks when kept and when needed, and dropped as soon as backward is done with it (so device
// memory is accounted as Megatron's caching allocator would see it).
#pragma once
#include <string>
#include <vector>

#include "layers/hooks.hpp"

namespace nodeemu::layers {

class SavedTensors {
 public:
  SavedTensors(ActivationHooks* hooks, int layer, int microbatch)
      : hooks_(hooks), layer_(layer), microbatch_(microbatch) {}
  void save(const std::string& module, const std::string& name, Tensor t, Stream& s);
  // The tensor, made resident by the hooks. Throws UsageError if it was never saved (or already
  // released): a schedule that runs a backward twice, or before its forward.
  Tensor need(const std::string& module, const std::string& name, Stream& s);
  void release(const std::string& module, const std::string& name);
  ModuleId module(const std::string& name) const { return {layer_, microbatch_, name}; }
  // A module's start and end for the hooks, where a scope cannot span them (an offload group
  // that commits in another node, on another stream).
  void start_module(const std::string& name, Stream& s);
  void end_module(const std::string& name, Stream& s);
  // A module's backward boundaries for the hooks (hooks.hpp).
  void backward_start(const std::string& name, Stream& s);
  void backward_end(const std::string& name, Stream& s);
  ActivationHooks* hooks() const { return hooks_; }

 private:
  ActivationHooks* hooks_;
  int layer_, microbatch_;
  struct Entry {
    std::string module, name;
    Tensor tensor;
  };
  std::vector<Entry>::iterator find(const std::string& module, const std::string& name);
  // A layer keeps a few dozen at most: a scan of short strings beats a tree's pointer chasing
  // (the std::map this was cost 2.5 % of a Qwen3 meta step).
  std::vector<Entry> saved_;
};

// Reports a module's start and end to the hooks around a scope.
class ModuleScope {
 public:
  ModuleScope(SavedTensors& saved, const std::string& module, Stream& s);
  ~ModuleScope();
  ModuleScope(const ModuleScope&) = delete;
  ModuleScope& operator=(const ModuleScope&) = delete;

 private:
  SavedTensors& saved_;
  ModuleId id_;
  Stream& stream_;
};

}  // namespace nodeemu::layers
