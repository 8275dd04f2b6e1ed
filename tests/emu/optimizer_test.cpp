// The run loop's optimizer: Adam and SGD both update the weights (SGD once threw on the Adam
// moments it does not have, which the schema walk found).
#include <gtest/gtest.h>

#include <cmath>

#include "emu/training.hpp"
#include "tests/emu/emu_test_support.hpp"

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

}  // namespace
}  // namespace nodeemu::emu
