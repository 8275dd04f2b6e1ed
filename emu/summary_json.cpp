// The JSON summary (`--summary FILE`) for scripts and CI, built with nlohmann::json in the order
// DESIGN.md lists its keys. The trace, which can hold millions of events, is streamed by
// devices/trace.cpp instead: a JSON document of it in memory would cost more than the run.
#include <nlohmann/json.hpp>
#include <ostream>

#include "emu/report.hpp"

namespace nodeemu::emu {

namespace {

using Json = nlohmann::ordered_json;

template <class T>
Json or_null(const std::optional<T>& v) {
  return v ? Json(*v) : Json(nullptr);
}

Json iteration_json(const IterationReport& it) {
  Json j;
  j["iter"] = it.iter;
  j["loss"] = or_null(it.loss);
  if (it.mtp_loss) j["mtp_loss"] = *it.mtp_loss;
  if (it.grad_norm) j["grad_norm"] = *it.grad_norm;
  j["step_time_s"] = it.step_time_s;
  return j;
}

Json device_json(const DeviceReport& d) {
  return Json{{"id", d.id},
              {"peak_mem_bytes", d.peak_mem_bytes},
              {"parameters", d.parameters},
              {"optimizer_state_bytes", d.optimizer_state_bytes},
              {"compute_busy_s", d.compute_busy_s},
              {"comm_busy_s", d.comm_busy_s},
              {"exposed_comm_s", d.exposed_comm_s},
              {"host_bound_s", d.host_bound_s},
              {"offload_bytes", d.offload_bytes},
              {"offload_busy_s", d.offload_busy_s},
              {"exposed_offload_s", d.exposed_offload_s},
              {"recompute_s", d.recompute_s},
              {"peak_mem_without_savers_bytes", or_null(d.peak_mem_without_savers_bytes)},
              {"gpu_numa", d.gpu_numa},
              {"host_numa", d.host_numa},
              {"host_real_numa", d.host_real_numa},
              {"host_cpus", d.host_cpus},
              {"pinned_host_bytes", d.pinned_host_bytes}};
}

}  // namespace

void write_summary_json(const RunReport& r, const Recipe& recipe, std::ostream& os) {
  Json j;
  j["recipe"] = r.recipe;
  j["mode"] = r.mode;
  j["gemm_kernel"] = r.gemm_kernel;
  j["schedule"] = r.schedule;
  j["topology"] = r.topology;
  j["world"] = r.world;
  j["ranks"] = r.ranks_run < r.world ? "representative" : "all";
  j["ranks_run"] = r.ranks_run;
  j["iterations"] = Json::array();
  for (const auto& it : r.iterations) j["iterations"].push_back(iteration_json(it));
  j["warmup_iterations"] = r.warmup_iterations;
  j["step_time_s"] = r.step_time_s;
  j["exposed_comm_s"] = r.exposed_comm_s;
  j["total_comm_s"] = r.total_comm_s;
  j["host_bound_s"] = r.host_bound_s;
  j["exposed_offload_s"] = r.exposed_offload_s;
  j["total_offload_s"] = r.total_offload_s;
  j["recompute_s"] = r.recompute_s;
  j["offload"] = r.offload;
  j["recompute"] = r.recompute;
  j["over_budget_reruns"] = r.over_budget_reruns;
  j["bindpcie"] = r.bindpcie;
  j["compute_utilisation"] = r.compute_utilisation;
  j["tokens_per_s_per_gpu"] = r.tokens_per_s_per_gpu;
  j["model_tflops_per_gpu"] = r.model_tflops_per_gpu;
  j["mfu"] = r.mfu;
  j["peak_bf16_tflops"] = r.peak_bf16_tflops;
  j["hidden_comm_share"] = r.hidden_comm_share;
  j["exposed_comm_by_collective_s"] = r.exposed_comm_by_name;
  j["exposed_comm_by_group_s"] = r.exposed_comm_by_group;
  j["devices"] = Json::array();
  for (const auto& d : r.devices) j["devices"].push_back(device_json(d));
  j["numerics_hash"] = r.numerics_hash ? Json(hex(*r.numerics_hash)) : Json(nullptr);
  j["timeline_hash"] = hex(r.timeline_hash);
  j["device_ops"] = r.device_ops;
  j["gpu_profile"] = r.gpu_profile;
  j["unpriced_kernels"] = r.unpriced_kernels;
  j["wall_time_s"] = r.wall_time_s;
  j["functional_kernel_flops"] = r.functional_kernel_flops;
  j["peak_host_bytes"] = or_null(r.peak_host_bytes);
  j["peak_kept_block_bytes"] = r.peak_kept_block_bytes;
  j["config"] = Json::object();
  for (const auto& [k, v] : recipe.flattened()) j["config"][k] = v;
  // Invalid UTF-8 in a recipe's text (a description) is replaced, not a failed write.
  os << j.dump(2, ' ', false, Json::error_handler_t::replace) << "\n";
}

}  // namespace nodeemu::emu
