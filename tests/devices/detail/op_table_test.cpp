// The engine's operation table: ids are issue order and never reused, a finished operation keeps
// only its completion time, and its record's slot goes to a later operation.
#include "devices/detail/op_table.hpp"

#include <gtest/gtest.h>

#include <memory>
#include <string>

namespace nodeemu::detail {
namespace {

struct Record {
  int value;  // no initialiser: a new record must be value-initialised
  std::string name;
  std::shared_ptr<int> held;
};

TEST(OpTable, IdsAreIssueOrderAndRecordsStartEmpty) {
  OpTable<Record> t;
  for (OpId i = 0; i < 5; ++i) {
    EXPECT_EQ(t.add(), i);
    EXPECT_EQ(t[i].value, 0);
    EXPECT_TRUE(t[i].name.empty());
    EXPECT_FALSE(t.complete(i));
    EXPECT_EQ(t.end(i), -1);
  }
  EXPECT_EQ(t.size(), 5u);
  EXPECT_EQ(t.live(), 5u);
}

TEST(OpTable, ARetiredOperationKeepsItsEndAndFreesItsSlot) {
  OpTable<Record> t;
  const OpId a = t.add();
  const OpId b = t.add();
  auto held = std::make_shared<int>(7);
  t[a].value = 3;
  t[a].name = "a name longer than the small-string buffer";
  t[a].held = held;
  Record* slot_of_a = &t[a];
  t.retire(a, 1234);
  EXPECT_TRUE(t.complete(a));
  EXPECT_EQ(t.end(a), 1234);
  EXPECT_EQ(held.use_count(), 1) << "what the record held is released when it retires";
  EXPECT_EQ(t.live(), 1u);
  // The next operation reuses the slot, cleared; the finished one is still answered by id.
  const OpId c = t.add();
  EXPECT_EQ(c, 2u) << "ids are never reused";
  EXPECT_EQ(&t[c], slot_of_a);
  EXPECT_EQ(t[c].value, 0);
  EXPECT_TRUE(t[c].name.empty());
  EXPECT_FALSE(t.complete(c));
  EXPECT_EQ(t.end(a), 1234);
  EXPECT_FALSE(t.complete(b));
  // A completion at time 0 is a completion.
  t.retire(b, 0);
  EXPECT_TRUE(t.complete(b));
  EXPECT_EQ(t.end(b), 0);
}

TEST(OpTable, RecordsInFlightAreBoundedByTheOperationsInFlight) {
  // A long run with a few operations in flight at a time: the records never grow past them.
  OpTable<Record> t;
  OpId oldest = t.add();
  for (int i = 0; i < 10000; ++i) {
    t.add();
    t.retire(oldest, i);
    ++oldest;
  }
  EXPECT_EQ(t.size(), 10001u);
  EXPECT_EQ(t.live(), 1u);
  EXPECT_EQ(t.records(), 2u);
  for (OpId i = 0; i < 10000; ++i) ASSERT_EQ(t.end(i), VTime(i));
}

TEST(OpTableDeathTest, TheRecordOfARetiredOperationIsABug) {
  OpTable<Record> t;
  const OpId a = t.add();
  t.retire(a, 5);
  EXPECT_DEATH((void)t[a], "retired operation");
}

}  // namespace
}  // namespace nodeemu::detail
