// The run loop's optimizer: Adam and SGD both update the weights (SGD once threw on the Adam
// moments it does not have, which the schema walk found).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>

#include "devices/node.hpp"
#include "emu/optimizer.hpp"
#include "emu/training.hpp"
#include "tests/emu/emu_test_support.hpp"
#include "tests/support/test_node.hpp"

namespace nodeemu::emu {
namespace {

TEST(Optimizer, SgdAndAdamBothTrain) {
  const RunReport adam = train(testing::tiny({"train.train_iters=3"}));
  const RunReport sgd =
      train(testing::tiny({"train.train_iters=3", "optimizer.optimizer=sgd", "optimizer.lr=0.5"}));
  ASSERT_EQ(sgd.iterations.size(), 3u);
  for (const auto& it : sgd.iterations) EXPECT_TRUE(std::isfinite(*it.loss));
  // The first step's loss is before any update: the same for both; then they part.
  EXPECT_EQ(*sgd.iterations[0].loss, *adam.iterations[0].loss);
  EXPECT_NE(*sgd.iterations[2].loss, *adam.iterations[2].loss);
  EXPECT_LT(*sgd.iterations[2].loss, *sgd.iterations[0].loss);
  EXPECT_NE(sgd.numerics_hash, adam.numerics_hash);
}

// Adam's elementwise update, as its bits are defined: fp32, no fused multiply-adds, in this order.
// The kernel computes several elements at a time where the CPU can; every element must still
// come out as this, whatever its position (the vector body and the tail alike).
TEST(Optimizer, AdamUpdatesEveryElementAsTheScalarDefinition) {
  const OptimizerConfig c{
      .adam = true, .lr = 3e-3, .weight_decay = 0.1, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8};
  constexpr int kElements = 23, kSteps = 3;  // not a multiple of any vector width
  // Every operation of the test's own arithmetic rounded on its own: clang folds a constant
  // a * b + c with one rounding (its default -ffp-contract=on), so the same expression could
  // give two values at two call sites of the ThreadSanitizer build.
  const auto round = [](float x) {
    volatile float v = x;
    return float(v);
  };
  // The inputs are made once, and both sides read these.
  std::vector<float> weights(kElements);
  std::vector<std::vector<float>> gradients(kSteps, std::vector<float>(kElements));
  for (int i = 0; i < kElements; ++i) {
    weights[std::size_t(i)] = round(round(0.05f * float(i - 11)) + 0.003f);
    for (int step = 0; step < kSteps; ++step)
      gradients[std::size_t(step)][std::size_t(i)] = round(
          std::sin(round(round(0.7f * float(i)) + float(step))) * (i % 5 == 0 ? 1e-4f : 0.02f));
  }
  for (const layers::DType dtype : {layers::DType::F32, layers::DType::BF16}) {
    Node node(testing::options(testing::round_h100()));
    std::vector<float> got;
    node.run([&](Host& host) {
      if (host.rank() != 0) return;
      Device& dev = host.device();
      Stream s = dev.default_stream();
      const layers::Tensor value = layers::Tensor::empty(dev, {kElements}, dtype);
      const layers::Tensor grad = layers::Tensor::empty(dev, {kElements}, layers::DType::F32);
      value.copy_from_f32(weights);
      Optimizer opt(c, {{value, grad, {}}}, /*distributed=*/false, dev, s);
      for (int step = 0; step < kSteps; ++step) {
        dev.synchronize();
        grad.copy_from_f32(gradients[std::size_t(step)]);
        opt.step(s);
      }
      dev.synchronize();
      got = value.to_f32();
    });
    // The reference: fp32 masters from the rounded initial weights, the moments from zero.
    std::vector<float> master(kElements), m(kElements, 0), v(kElements, 0);
    for (int i = 0; i < kElements; ++i)
      master[std::size_t(i)] = layers::round_to(dtype, weights[std::size_t(i)]);
    const float lr = float(c.lr), wd = float(c.weight_decay), b1 = float(c.beta1),
                b2 = float(c.beta2), eps = float(c.eps);
    for (int step = 1; step <= kSteps; ++step) {
      const float bc1 = float(1 - std::pow(c.beta1, step)),
                  bc2 = float(1 - std::pow(c.beta2, step));
      for (int i = 0; i < kElements; ++i) {
        const std::size_t k = std::size_t(i);
        const float g = gradients[std::size_t(step - 1)][k];
        m[k] = round(round(b1 * m[k]) + round(round(1 - b1) * g));
        v[k] = round(round(b2 * v[k]) + round(round(round(1 - b2) * g) * g));
        const float update =
            round(round(round(m[k] / bc1) / round(std::sqrt(round(v[k] / bc2)) + eps)) +
                  round(wd * master[k]));
        master[k] = round(master[k] - round(lr * update));
      }
    }
    ASSERT_EQ(got.size(), std::size_t(kElements));
    for (int i = 0; i < kElements; ++i)
      EXPECT_EQ(got[std::size_t(i)], layers::round_to(dtype, master[std::size_t(i)]))
          << "element " << i << ", weights in " << layers::dtype_name(dtype);
  }
}

// What Megatron's step launches (emu/optimizer.hpp): FusedAdam's kernels as multi_tensor_apply
// cuts the list of tensors Megatron holds (36 a launch for Adam's four lists), then the masters
// copied into the parameters: one multi-tensor copy after its flag's fill, or with the
// distributed optimizer one copy per tensor. Either way every element comes out the same, and
// the elements between the tensors (a shard's padding) are not touched.
TEST(Optimizer, LaunchesWhatMegatronsStepLaunches) {
  constexpr int kTensors = 40, kEach = 100, kStride = kEach + 1;  // one element of padding each
  const OptimizerConfig c{
      .adam = true, .lr = 1e-2, .weight_decay = 0.1, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8};
  std::vector<float> weights(kTensors * kStride), gradients(weights.size());
  for (std::size_t i = 0; i < weights.size(); ++i) {
    weights[i] = 0.01f * float(int(i % 37) - 18);
    gradients[i] = 0.001f * (float(i % 11) - 5.5f);  // never 0: every element moves
  }
  std::map<bool, std::vector<float>> updated;
  for (const bool distributed : {false, true}) {
    SCOPED_TRACE(distributed ? "distributed" : "not distributed");
    Node node(testing::options(testing::round_h100()));
    node.run([&](Host& host) {
      if (host.rank() != 0) return;
      Device& dev = host.device();
      Stream s = dev.default_stream();
      const auto n = std::int64_t(weights.size());
      const layers::Tensor value = layers::Tensor::empty(dev, {n}, layers::DType::BF16);
      const layers::Tensor grad = layers::Tensor::empty(dev, {n}, layers::DType::F32);
      value.copy_from_f32(weights);
      grad.copy_from_f32(gradients);
      layers::OptimizerTarget target{value, grad, {}};
      for (int t = 0; t < kTensors; ++t) target.tensors.push_back({t * kStride, kEach});
      Optimizer opt(c, {target}, distributed, dev, s);
      opt.step(s);
      dev.synchronize();
      updated[distributed] = value.to_f32();
    });
    std::map<std::string, int> launched;
    for (const auto& op : node.trace().ops())
      if (op.device == 0) ++launched[op.name];
    EXPECT_EQ(launched["optimizer.multi_tensor_adam"], 2);
    EXPECT_EQ(launched["optimizer.copy_main_to_model"], distributed ? kTensors : 0);
    EXPECT_EQ(launched["optimizer.multi_tensor_copy_main_to_model"], distributed ? 0 : 1);
    EXPECT_EQ(launched["optimizer.overflow_buf_fill"], distributed ? 0 : 1);
    const std::vector<float>& got = updated[distributed];
    ASSERT_EQ(got.size(), weights.size());
    for (int t = 0; t < kTensors; ++t) {
      const std::size_t pad = std::size_t(t * kStride + kEach), inside = pad - 1;
      EXPECT_EQ(got[pad], layers::round_to(layers::DType::BF16, weights[pad])) << "padding " << t;
      EXPECT_NE(got[inside], layers::round_to(layers::DType::BF16, weights[inside]))
          << "tensor " << t;
    }
  }
  EXPECT_EQ(updated[false], updated[true]);
}

// The distributed optimizer's gradient norm (issue 54: --clip-grad, Megatron's default 1.0).
// Split over TP2 the same gradients give the same world norm: a TP-duplicated weight (the norms,
// the router) counts on TP rank 0 only, as MegatronOptimizer._filter_grads_for_norm has it.
const std::vector<std::string> kNormRuns = {"ddp.use_distributed_optimizer=true",
                                            "train.train_iters=2"};

std::vector<std::string> joined(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(Optimizer, TheGradientNormIsTheSameOverATensorParallelSplit) {
  const RunReport unsplit = train(testing::tiny(kNormRuns));
  const RunReport tp2 = train(testing::tiny(
      joined(kNormRuns, {"emulator.gpus_per_node=8", "model.tensor_model_parallel_size=2",
                         "model.sequence_parallel=true", "model.expert_tensor_parallel_size=1"})));
  ASSERT_TRUE(unsplit.iterations[0].grad_norm);
  ASSERT_TRUE(tp2.iterations[0].grad_norm);
  const double a = *unsplit.iterations[0].grad_norm, b = *tp2.iterations[0].grad_norm;
  EXPECT_GT(a, 0);
  // bf16 activations split differently: the loss agrees to 1e-3 (TensorParallelRun), the norm
  // to a few parts in 1,000; counting the duplicated weights twice would add their share again.
  EXPECT_NEAR(b / a, 1.0, 5e-3) << "TP1 " << a << ", TP2 " << b;
  // Without the distributed optimizer NodeEmu reduces no norm (and reports none).
  EXPECT_FALSE(train(testing::tiny({"train.train_iters=1"})).iterations[0].grad_norm);
}

// Clipping scales every gradient by clip / (norm + 1e-6): SGD then steps as the unclipped one
// at the rate scaled by the same factor, up to the bf16 weights' rounding of masters a last bit
// apart (a dense model: the MoE router's top-k would turn those bits into other routes).
// Measured: the clip moves the second loss by 2.8e-3, the scaled rate lands 1.8e-5 from it.
TEST(Optimizer, ClippedSgdStepsAsUnclippedSgdAtTheScaledRate) {
  const std::vector<std::string> sgd = joined(
      kNormRuns,
      {"optimizer.optimizer=sgd", "model.num_moe_experts=", "model.expert_model_parallel_size=1"});
  const RunReport free = train(testing::tiny(joined(sgd, {"optimizer.lr=0.5"})));
  const double norm = *free.iterations[0].grad_norm;
  const double clip = norm / 4;
  const RunReport clipped = train(testing::tiny(
      joined(sgd, {"optimizer.lr=0.5", "optimizer.clip_grad=" + std::to_string(clip)})));
  EXPECT_EQ(*clipped.iterations[0].grad_norm, norm);  // the norm is before clipping
  const double k = float(clip) / (float(norm) + 1e-6f);
  const RunReport scaled =
      train(testing::tiny(joined(sgd, {"optimizer.lr=" + std::to_string(0.5 * k)})));
  const double effect = std::abs(*clipped.iterations[1].loss - *free.iterations[1].loss);
  EXPECT_GT(effect, 1e-3);
  EXPECT_LT(std::abs(*clipped.iterations[1].loss - *scaled.iterations[1].loss), 0.05 * effect);
  // A clip above the norm leaves the step as it was.
  const RunReport loose = train(testing::tiny(
      joined(sgd, {"optimizer.lr=0.5", "optimizer.clip_grad=" + std::to_string(norm * 4)})));
  EXPECT_EQ(loose.numerics_hash, free.numerics_hash);
}

// What a step launches for the norm (meta mode, two GPUs): the l2norm over the shard, its
// cleanup, the square, the all-reduce over every rank and the root; with clipping the
// coefficient's three kernels, the flag's fill and the scale over every gradient.
TEST(Optimizer, TheNormAndTheClipLaunchWhatMegatronLaunches) {
  auto launched = [](const std::vector<std::string>& extra) {
    const std::vector<std::string> o =
        joined({"emulator.mode=meta", "model.moe_router_force_load_balancing=true",
                "ddp.use_distributed_optimizer=true"},
               extra);
    const std::string trace = testing::trace_path("grad_norm", o);
    (void)train(testing::tiny(o), {.iterations = 1, .trace_path = trace});
    std::ifstream in(trace);
    const auto events = nlohmann::json::parse(in)["traceEvents"];
    std::remove(trace.c_str());
    std::map<std::string, int> seen;
    for (const auto& e : events)  // the device's operations, not the host's launches
      if (e.value("pid", -1) == 0 && e.value("cat", "") != "host") ++seen[e.value("name", "")];
    return seen;
  };
  std::map<std::string, int> norm = launched({});
  EXPECT_GE(norm["optimizer.grad_norm.multi_tensor_l2norm"], 1);
  for (const char* k :
       {"optimizer.grad_norm.multi_tensor_l2norm_cleanup", "optimizer.grad_norm.pow",
        "get_grad_norm_fp32_allreduce", "optimizer.grad_norm.root"})
    EXPECT_EQ(norm[k], 1) << k;
  EXPECT_EQ(norm["optimizer.clip.multi_tensor_scale"], 0);
  std::map<std::string, int> clip = launched({"optimizer.clip_grad=1.0"});
  for (const char* k : {"optimizer.clip.add_eps", "optimizer.clip.div", "optimizer.clip.clamp_max",
                        "optimizer.clip.overflow_buf_fill"})
    EXPECT_EQ(clip[k], 1) << k;
  EXPECT_GE(clip["optimizer.clip.multi_tensor_scale"], 1);
}

}  // namespace
}  // namespace nodeemu::emu
