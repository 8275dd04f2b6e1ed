// NodeEmu against one real layer: the H100 layer anatomy (configs/calibration/h100_layer_anatomy,
// an eager Qwen3-30B-A3B layer as an EP16 rank runs it, kernel by kernel, with its host time)
// run as NodeEmu models it (configs/recipes/qwen3_30b_a3b_layer_anatomy.yaml: the same shapes,
// Megatron's unfused paths, an eager host). Kernel count within 10 %; kernel time within 15 % for
// GEMMs, attention, row gathers/scatters, and the memory-bound rest (elementwise and copies
// together: apart, the copies are +72 %, README "How close is NodeEmu to a real GPU" says why);
// forward+backward device time within 10 % (less the kernels Megatron launches and the measured
// layer, plain PyTorch, does not: see megatron_only) and host issue time within 15 % for each
// measured variant whose parameters are laid out as Megatron's (the 32-expert one is not).
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "emu/layer_timing.hpp"
#include "tests/emu/emu_test_support.hpp"

namespace nodeemu::emu {
namespace {

using testing::recipe_path;

const std::string kAnatomy =
    std::string(NODEEMU_SOURCE_DIR) + "/configs/calibration/h100_layer_anatomy/";

// The classes the comparison is made in, for a kernel of the trace (by its name) and for one of
// NodeEmu's (by its class and name): GEMMs with their cuBLAS/CUTLASS helpers, attention with
// cuDNN's, row gathers and scatters, copies (casts, cats, strided copies, D2D), and the
// elementwise rest with fills and memsets.
std::string trace_class(const std::string& k) {
  auto has = [&](const char* s) { return k.find(s) != std::string::npos; };
  if (has("nvjet") || has("xmma_gemm") || has("GemmUniversal") || has("sgemm") ||
      has("splitKreduce") || has("prepare_grouped"))
    return "gemm";
  if (has("sdpa") || has("cudnn")) return "attention";
  if (has("gather") || has("indexFunc") || has("scatter")) return "permute";
  if (has("Memcpy") || has("direct_copy") || has("CatArray") || has("bfloat16_copy")) return "copy";
  return "elementwise";
}

std::string nodeemu_class(const LayerOp& op) {
  auto has = [&](const char* s) { return op.name.find(s) != std::string::npos; };
  if (op.cls == "memcpy" || has(".cat") || has("to_fp32") || has("_dtype")) return "copy";
  return op.cls;
}

struct Trace {
  std::map<std::string, double> seconds;  // by class
  int kernels = 0;
};

Trace read_trace() {
  std::ifstream in(kAnatomy + "qwen3_30b_a3b_ep16_layer_kernels.csv");
  EXPECT_TRUE(in) << "the anatomy's kernel trace is missing";
  std::string line;
  std::getline(in, line);  // start_us,duration_us,kernel
  Trace t;
  while (std::getline(in, line)) {
    const auto a = line.find(','), b = line.find(',', a + 1);
    t.seconds[trace_class(line.substr(b + 1))] += std::stod(line.substr(a + 1, b - a - 1)) * 1e-6;
    ++t.kernels;
  }
  return t;
}

struct Variant {
  std::string name;
  double host_s = 0, device_s = 0;
};

std::vector<Variant> read_variants() {
  std::ifstream in(kAnatomy + "layer_host.csv");
  std::string line;
  std::getline(in, line);  // variant,host_issue_s,device_s
  std::vector<Variant> v;
  while (std::getline(in, line)) {
    std::stringstream s(line);
    Variant x;
    std::string f;
    std::getline(s, x.name, ',');
    std::getline(s, f, ',');
    x.host_s = std::stod(f);
    std::getline(s, f, ',');
    x.device_s = std::stod(f);
    v.push_back(x);
  }
  return v;
}

// Each measured variant as overrides of the recipe (its header says how).
std::vector<std::string> overrides_of(const std::string& variant) {
  if (variant == "qwen3_ep16_half_rows") return {"model.moe_router_topk=4"};
  if (variant == "qwen3_ep4_32experts")
    return {"model.expert_model_parallel_size=4", "model.moe_router_topk=4"};
  if (variant == "qwen3_ep16_seq8192") return {"train.seq_length=8192"};
  return {};
}

// The device time of the kernels NodeEmu launches because Megatron does, which the measured layer
// (layer.py: a fixed row index, precomputed RoPE tables, one 3-D weight per expert linear) does
// not run:
// - the alltoall dispatcher's chunk sorts and the counts' copy to the host
//   (token_dispatcher.py, MoEAlltoAllTokenDispatcher: sort_chunks_by_idxs, cuda_dtoh_point);
// - moe_utils.permute's bookkeeping (the routing map's transpose, the sort, the probs' gather);
// - RoPE's cos and sin made per call and its closing cat with the unrotated columns
//   (rope_utils.py, _apply_rotary_pos_emb_bshd);
// - the query's reshape copy (attention.py, get_query_key_value_tensors, with GQA);
// - the main-grad adds of every local expert after the first of each linear (the measured layer
//   accumulates one gradient per 3-D weight).
// Taking out their own time under-corrects where the layer waits on its host (their launch time
// stays in): a conservative comparison.
double megatron_only_s(const LayerTiming& t) {
  double s = 0;
  std::map<std::string, int> adds;
  for (const auto& op : t.timeline) {
    auto has = [&](const char* x) { return op.name.find(x) != std::string::npos; };
    auto ends = [&](const std::string& x) {
      return op.name.size() >= x.size() &&
             op.name.compare(op.name.size() - x.size(), x.size(), x) == 0;
    };
    const bool expert_add = has("expert_fc") && ends("_main_grad_add");
    if (expert_add && adds[op.name]++ == 0) continue;
    if (expert_add || has("sort_chunks") || has("sort_probs") || op.name == "counts D2H" ||
        op.name.rfind("permute.", 0) == 0 || has("query_reshape") ||
        (op.name.rfind("rotary_pos_emb.", 0) == 0 &&
         (ends(".cos") || ends(".sin") || (ends(".cat") && !ends(".cat_half")))))
      s += op.end_s - op.start_s;
  }
  return s;
}

LayerTiming anatomy_layer(const std::vector<std::string>& overrides = {}) {
  const LayerReport r =
      time_layers(Recipe::load(recipe_path("qwen3_30b_a3b_layer_anatomy"), overrides));
  EXPECT_EQ(r.layers.size(), 1u);
  return r.layers.front();
}

TEST(LayerAnatomy, KernelCountAndTimeByClassMatchTheTrace) {
  const Trace trace = read_trace();
  ASSERT_EQ(trace.kernels, 119);
  const LayerTiming t = anatomy_layer();
  EXPECT_EQ(t.local_experts, 8);
  EXPECT_EQ(t.rows_per_expert, 4096);
  int kernels = 0;
  std::map<std::string, double> ours;
  for (const auto& op : t.timeline) {
    if (op.cls == "comm") continue;
    ++kernels;
    ours[nodeemu_class(op)] += op.end_s - op.start_s;
  }
  EXPECT_NEAR(kernels, trace.kernels, 0.10 * trace.kernels);
  // Copies apart are not within 15 %: NodeEmu's include the alltoall dispatcher's chunk sorts
  // (Megatron's, which the trace's layer, with no dispatcher, does not run), and the trace's
  // slice-backward copies NodeEmu runs as strided elementwise kernels (SwiGLU's chunk backward).
  const double copies_measured = trace.seconds.at("copy"), copies = ours["copy"];
  EXPECT_GT(copies, copies_measured);
  std::map<std::string, double> measured_by = trace.seconds;
  measured_by["elementwise"] += copies_measured;
  ours["elementwise"] += copies;
  measured_by.erase("copy");
  for (const auto& [cls, measured] : measured_by) {
    SCOPED_TRACE(cls);
    EXPECT_NEAR(ours[cls], measured, 0.15 * measured)
        << "NodeEmu " << ours[cls] * 1e6 << " us, the trace " << measured * 1e6 << " us";
  }
}

TEST(LayerAnatomy, EachVariantsDeviceAndHostTimeMatchTheMeasurement) {
  const std::vector<Variant> variants = read_variants();
  ASSERT_EQ(variants.size(), 4u);
  for (const auto& v : variants) {
    SCOPED_TRACE(v.name);
    const LayerTiming t = anatomy_layer(overrides_of(v.name));
    if (v.name == "qwen3_ep4_32experts") {
      // Megatron's grouped experts (TE GroupedLinear) hold one parameter per expert, so without
      // gradient-accumulation fusion each of the 32 experts' fc1 and fc2 gradients gets its own
      // main_grad add: 64 kernels with their host time, where the trace's layer, one 3-D
      // parameter per linear, adds 2. NodeEmu is slower here by those adds (+24-28 %), a
      // difference of layout, not of pricing: the rest of the layer is the 8-expert one's.
      EXPECT_GT(t.forward_backward_s, v.device_s);
      EXPECT_GT(t.host_issue_s, v.host_s);
      continue;
    }
    const double extra = megatron_only_s(t);
    EXPECT_GT(extra, 0.0);
    EXPECT_NEAR(t.forward_backward_s - extra, v.device_s, 0.10 * v.device_s)
        << "NodeEmu " << t.forward_backward_s * 1e3 << " ms, of which Megatron's own kernels "
        << extra * 1e3 << " ms";
    EXPECT_NEAR(t.host_issue_s, v.host_s, 0.15 * v.host_s)
        << "NodeEmu " << t.host_issue_s * 1e3 << " ms";
  }
}

}  // namespace
}  // namespace nodeemu::emu
