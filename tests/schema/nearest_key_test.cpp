// The "did you mean" every loader gives (the topology, a GPU profile, a recipe, an override, a
// Megatron flag).
#include <gtest/gtest.h>

#include "schema/nearest_key.hpp"

namespace nodeemu::schema {
namespace {

const std::vector<std::string> kKeys = {
    "gpu",   "gpu.sms",          "gpu.latency", "nvlink",          "nvlink.latency_us",
    "model", "model.num_layers", "train",       "train.seq_length"};

TEST(NearestKey, ASiblingFirst) {
  const Suggestion s = nearest_key(kKeys, "gpu", "smz");
  EXPECT_EQ(s.key, "gpu.sms");
  EXPECT_FALSE(s.elsewhere);
}

TEST(NearestKey, ARightNameInAnotherMap) {
  const Suggestion s = nearest_key(kKeys, "train", "num_layers");
  EXPECT_EQ(s.key, "model.num_layers");
  EXPECT_TRUE(s.elsewhere);
  // Further down the same branch is not "elsewhere".
  const Suggestion down = nearest_key(kKeys, "", "latency_us");
  EXPECT_EQ(down.key, "nvlink.latency_us");
  EXPECT_FALSE(down.elsewhere);
}

TEST(NearestKey, NothingWhenFarther) {
  EXPECT_EQ(nearest_key(kKeys, "model", "hidden_size").key, "");
  EXPECT_EQ(nearest_key(kKeys, "", "x").key, "");
}

TEST(NearestKey, EditDistance) {
  EXPECT_EQ(edit_distance("", ""), 0u);
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(edit_distance("abc", ""), 3u);
}

}  // namespace
}  // namespace nodeemu::schema
