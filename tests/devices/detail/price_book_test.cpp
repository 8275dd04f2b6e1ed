// The node's price book: each distinct (work, GPU) is priced once, and every kernel name the
// roofline fallback priced is listed for the run summary, however often and in whatever order
// names that share one shape come.
#include "devices/detail/price_book.hpp"

#include <gtest/gtest.h>

#include "devices/cost_model.hpp"

namespace nodeemu::detail {
namespace {

GpuSpec hand_built() {  // no profile: every kernel is priced by the roofline, and unpriced
  GpuSpec g;
  g.name = "hand-built";
  g.sms = 132;
  g.bf16_flops = 989e12;
  g.fp32_flops = 67e12;
  g.hbm_bytes_per_s = 3.35e12;
  return g;
}

TEST(PriceBook, APriceIsTheCostModelsAndRepeatsExactly) {
  const GpuSpec g = hand_built();
  PriceBook book;
  const Work w{.flops = 1e9, .bytes = 1e6};
  const double first = book.seconds(g, w, "k");
  EXPECT_EQ(first, kernel_price(g, w).seconds);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(book.seconds(g, w, "k"), first);
  EXPECT_NE(book.seconds(g, Work{.flops = 2e9, .bytes = 1e6}, "k"), first);
}

TEST(PriceBook, EveryNameOfAnUnpricedShapeIsListedOnce) {
  const GpuSpec g = hand_built();
  PriceBook book;
  const Work w{.flops = 1e9};
  // Names alternate on one shape (the book remembers the last name per shape, so a name seen
  // before but not last must still be found, and not added twice).
  for (const char* name : {"a", "b", "a", "", "b", "", "c"}) book.seconds(g, w, name);
  ASSERT_EQ(book.unpriced().size(), 4u);
  EXPECT_TRUE(book.unpriced().count("a"));
  EXPECT_TRUE(book.unpriced().count("b"));
  EXPECT_TRUE(book.unpriced().count("c"));
  EXPECT_TRUE(book.unpriced().count(""));  // an empty name is a name too
  // A name is listed however many shapes it is launched with.
  book.seconds(g, Work{.flops = 3e9}, "a");
  EXPECT_EQ(book.unpriced().size(), 4u);
}

TEST(PriceBook, ManyShapesKeepTheirOwnPrices) {
  // Enough shapes to make the table grow several times: each keeps its own price.
  const GpuSpec g = hand_built();
  PriceBook book;
  std::vector<double> first;
  for (int i = 1; i <= 5000; ++i)
    first.push_back(book.seconds(g, Work{.flops = 1e6 * i, .bytes = 64.0 * i}, "k"));
  for (int i = 1; i <= 5000; ++i)
    EXPECT_EQ(book.seconds(g, Work{.flops = 1e6 * i, .bytes = 64.0 * i}, "k"),
              first[std::size_t(i - 1)]);
}

}  // namespace
}  // namespace nodeemu::detail
