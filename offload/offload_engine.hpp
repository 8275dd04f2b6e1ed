// Fine-grained activation offload for one rank (Megatron-Core's fine_grained_activation_offload,
// REFERENCE §3), on both planes: real bytes through the device's copy engines into pinned host
// memory, and the copies' cost on the virtual clock.
//
// It is the layers' ActivationHooks. A group opens at an offload module's start and captures the
// tensors the module saves for backward (at least min_tensor_elements each); an offload_tensors
// name is a group of its own. At the module's end the group commits: the D2H stream waits on the
// compute stream, copies each tensor into the pinned pool, records the group's event and drops
// the device copy (its memory returns when the copy is done). When backward first needs a group,
// the stream waits for its reload (issued then if no prefetch did it): at its module's backward
// start (Megatron's commit backward), or at the first read of one of its tensors. When the
// module's backward ends (after its dgrad, and its wgrad unless delayed: Megatron's group-start
// backward; hooks.hpp), or else when all its tensors are released, the H2D stream waits on that
// stream and reloads the next group of that chunk handler in LIFO order: one group of prefetch;
// with none left, the last offloaded group of the handler whose backward runs next. Every H2D
// waits for its own D2H.
//
// Decisions follow Megatron's chunk handlers (ChunkOffloadHandler): one per micro-batch's forward
// through one model chunk. The warm-up iteration offloads every group and records the handlers
// in forward order and the order their backward ran; then plan_after_warmup decides each group
// of each handler (offload_policy.hpp), and at commit the last group of a name in the handler
// whose backward runs next also stays (should_bulk_offload). max_inflight caps, per group name,
// the offloads the committing stream has not waited for (_drain_offload_pending).
//
//   offload::OffloadEngine engine(device, {.modules = {"expert_fc1", "moe_act"}});
//   ctx.hooks = &engine;
//   for (int it = 0; it < iterations; ++it) {
//     engine.begin_iteration();
//     ... forward and backward ...
//     device.synchronize();
//     engine.end_iteration();  // the first fixes the plan
//   }
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "layers/hooks.hpp"
#include "offload/offload_config.hpp"
#include "offload/offload_policy.hpp"
#include "offload/pinned_host_pool.hpp"

namespace nodeemu::offload {

struct IterationStats {
  std::uint64_t bytes_offloaded = 0;  // D2H
  std::uint64_t bytes_reloaded = 0;   // H2D
  int groups_offloaded = 0;
  int groups_kept = 0;                 // committed but left on the device by the plan
  std::uint64_t tensors_verified = 0;  // reloads whose checksum matched what left (functional)
  int reloads_on_demand = 0;           // issued when backward needed them: no prefetch had
};

class OffloadEngine final : public layers::ActivationHooks {
 public:
  // Throws ConfigError for a bad config.
  OffloadEngine(Device& device, OffloadConfig config);
  ~OffloadEngine() override;
  OffloadEngine(const OffloadEngine&) = delete;
  OffloadEngine& operator=(const OffloadEngine&) = delete;

  void begin_iteration();
  // After the host synchronized the device. Throws OffloadHazard when a reload's checksum did not
  // match. The first call ends the warm-up and fixes the plan.
  void end_iteration();
  const OffloadPlan& plan() const;     // empty until warm-up ends
  const WarmupRecord& warmup() const;  // the chunk handlers and groups the warm-up saw
  const std::vector<IterationStats>& iterations() const;  // one per finished iteration
  const OffloadConfig& config() const;
  const PinnedHostPool& host_pool() const;

  // For tests: a deliberately broken engine, for the hazard checker to catch.
  enum class Fault {
    None,
    ReloadWithoutOffloadWait,  // the H2D stream does not wait for the group's D2H
    ComputeWithoutReloadWait,  // backward does not wait for the reload
    SkipReload,                // backward is handed the released device copy
  };
  void inject_fault(Fault f);

  void module_start(const layers::ModuleId& m, Stream& s) override;
  void module_end(const layers::ModuleId& m, Stream& s) override;
  void tensor_saved(const layers::SavedTensorId& id, layers::Tensor& t, Stream& s) override;
  void tensor_needed(const layers::SavedTensorId& id, layers::Tensor& t, Stream& s) override;
  void tensor_released(const layers::SavedTensorId& id) override;
  void module_backward_start(const layers::ModuleId& m, Stream& s) override;
  void module_backward_end(const layers::ModuleId& m, Stream& s) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace nodeemu::offload
