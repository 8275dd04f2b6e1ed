// The operation log's store: positions are ids, and an element never moves.
#include "devices/detail/chunked_log.hpp"

#include <gtest/gtest.h>

#include <string>

namespace nodeemu::detail {
namespace {

struct Item {
  int value;  // no initialiser: value-initialisation must zero it
  std::string name;
};

TEST(ChunkedLog, ElementsKeepTheirPlaceAndPositionAcrossChunks) {
  ChunkedLog<Item, 2> log;  // chunks of 4
  Item& first = log.emplace_back();
  EXPECT_EQ(first.value, 0);
  first.name = "first";
  for (int i = 1; i < 11; ++i) {
    Item& it = log.emplace_back();
    EXPECT_EQ(it.value, 0) << i;
    it.value = i;
  }
  EXPECT_EQ(log.size(), 11u);
  EXPECT_EQ(&log[0], &first) << "an element never moves";
  EXPECT_EQ(first.name, "first");
  for (int i = 1; i < 11; ++i) EXPECT_EQ(log[std::size_t(i)].value, i);
  const auto& view = log;
  EXPECT_EQ(view[10].value, 10);
}

}  // namespace
}  // namespace nodeemu::detail
