// The run loop's optimizer: Adam and SGD both update the weights (SGD once threw on the Adam
// moments it does not have, which the schema walk found).
#include <gtest/gtest.h>

#include <cmath>

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
  const auto weight = [](int i) { return 0.05f * float(i - 11) + 0.003f; };
  const auto gradient = [](int step, int i) {
    return std::sin(0.7f * float(i) + float(step)) * (i % 5 == 0 ? 1e-4f : 0.02f);
  };
  for (const layers::DType dtype : {layers::DType::F32, layers::DType::BF16}) {
    Node node(testing::options(testing::round_h100()));
    std::vector<float> got;
    node.run([&](Host& host) {
      if (host.rank() != 0) return;
      Device& dev = host.device();
      Stream s = dev.default_stream();
      const layers::Tensor value = layers::Tensor::empty(dev, {kElements}, dtype);
      const layers::Tensor grad = layers::Tensor::empty(dev, {kElements}, layers::DType::F32);
      std::vector<float> w0(kElements);
      for (int i = 0; i < kElements; ++i) w0[std::size_t(i)] = weight(i);
      value.copy_from_f32(w0);
      Optimizer opt(c, {{value, grad}}, dev, s);
      for (int step = 0; step < kSteps; ++step) {
        std::vector<float> g(kElements);
        for (int i = 0; i < kElements; ++i) g[std::size_t(i)] = gradient(step, i);
        dev.synchronize();
        grad.copy_from_f32(g);
        opt.step(s);
      }
      dev.synchronize();
      got = value.to_f32();
    });
    // The reference: fp32 masters from the rounded initial weights, the moments from zero.
    std::vector<float> master(kElements), m(kElements, 0), v(kElements, 0);
    for (int i = 0; i < kElements; ++i) master[std::size_t(i)] = layers::round_to(dtype, weight(i));
    const float lr = float(c.lr), wd = float(c.weight_decay), b1 = float(c.beta1),
                b2 = float(c.beta2), eps = float(c.eps);
    for (int step = 1; step <= kSteps; ++step) {
      const float bc1 = float(1 - std::pow(c.beta1, step)),
                  bc2 = float(1 - std::pow(c.beta2, step));
      for (int i = 0; i < kElements; ++i) {
        const std::size_t k = std::size_t(i);
        const float g = gradient(step - 1, i);
        volatile float t;  // keeps each operation its own rounding
        t = b1 * m[k];
        m[k] = t + (1 - b1) * g;
        t = b2 * v[k];
        t = t + (1 - b2) * g * g;
        v[k] = t;
        t = (m[k] / bc1) / (std::sqrt(v[k] / bc2) + eps);
        t = t + wd * master[k];
        master[k] = master[k] - lr * t;
      }
    }
    ASSERT_EQ(got.size(), std::size_t(kElements));
    for (int i = 0; i < kElements; ++i)
      EXPECT_EQ(got[std::size_t(i)], layers::round_to(dtype, master[std::size_t(i)]))
          << "element " << i << ", weights in " << layers::dtype_name(dtype);
  }
}

}  // namespace
}  // namespace nodeemu::emu
