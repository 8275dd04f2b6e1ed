#include "comm/channel.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "comm/fast_copy.hpp"
#include "devices/errors.hpp"
#include "devices/numa_memory.hpp"

namespace nodeemu::detail {
namespace {

constexpr std::byte kSentinel{0xEE};  // gap bytes between segments, never part of a payload

// The byte at stream position `pos` of payload `source`: a hash of both, so a byte delivered to
// the wrong position, or from the wrong transfer, differs from what is expected there.
std::byte payload(int source, std::size_t pos) {
  std::uint64_t x = (static_cast<std::uint64_t>(source) << 48) ^ pos;
  x *= 0x9E3779B97F4A7C15ull;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  return static_cast<std::byte>(x >> 56);
}

// A stream of `total` bytes laid out as pieces of an arena with gaps of kSentinel between them.
// Piece sizes are random multiples of `unit` up to max_piece, zero-sized pieces included; the
// gaps are multiples of `unit` too, so unit 4 keeps every piece float-aligned.
struct Scattered {
  std::vector<std::byte> arena;
  std::vector<std::pair<std::size_t, std::size_t>> pieces;  // (offset in arena, bytes)

  Segments segments() {
    Segments out;
    for (auto [offset, bytes] : pieces) out.push_back({arena.data() + offset, bytes});
    return out;
  }
  ConstSegments const_segments() const {
    ConstSegments out;
    for (auto [offset, bytes] : pieces) out.push_back({arena.data() + offset, bytes});
    return out;
  }
  // The arena offset of stream position `pos`.
  std::size_t where(std::size_t pos) const {
    for (auto [offset, bytes] : pieces) {
      if (pos < bytes) return offset + pos;
      pos -= bytes;
    }
    ADD_FAILURE() << "position past the stream";
    return 0;
  }
};

Scattered scattered(std::size_t total, std::size_t max_piece, std::uint32_t seed,
                    std::size_t unit = 1) {
  std::mt19937 rng(seed);
  Scattered s;
  std::size_t offset = unit * (1 + rng() % 15), left = total;
  while (left > 0) {
    std::size_t bytes = unit * (rng() % (max_piece / unit + 1));
    if (rng() % 8 == 0) bytes = 0;  // empty segments must be skipped
    bytes = std::min(bytes, left);
    s.pieces.push_back({offset, bytes});
    offset += bytes + unit * (1 + rng() % 16);
    left -= bytes;
  }
  s.arena.assign(offset + 64, kSentinel);
  return s;
}

void fill_payload(Scattered& s, int source) {
  std::size_t pos = 0;
  for (auto [offset, bytes] : s.pieces)
    for (std::size_t i = 0; i < bytes; ++i) s.arena[offset + i] = payload(source, pos++);
}

// The destination after a serial reference copy: payload bytes in the pieces, sentinels between.
std::vector<std::byte> expected_arena(const Scattered& dst, int source) {
  std::vector<std::byte> out(dst.arena.size(), kSentinel);
  std::size_t pos = 0;
  for (auto [offset, bytes] : dst.pieces)
    for (std::size_t i = 0; i < bytes; ++i) out[offset + i] = payload(source, pos++);
  return out;
}

// Reports the first mismatch instead of a megabyte-long diff.
::testing::AssertionResult same_bytes(const std::vector<std::byte>& got,
                                      const std::vector<std::byte>& want) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "sizes differ";
  for (std::size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i])
      return ::testing::AssertionFailure()
             << "arena byte " << i << " is " << static_cast<int>(got[i]) << ", expected "
             << static_cast<int>(want[i]);
  return ::testing::AssertionSuccess();
}

// ---------------------------------------------------------------------------------------------
// fast_copy

TEST(FastCopyTest, CopyBytesMatchesMemcpyAtEveryAlignmentAndLength) {
  std::vector<std::byte> src(70000), dst(70000);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = payload(1, i);
  for (bool streaming : {false, true}) {
    for (std::size_t src_off : {0, 1, 7, 64}) {
      for (std::size_t dst_off : {0, 3, 33, 63}) {
        for (std::size_t n : {0, 1, 63, 64, 65, 255, 256, 257, 4099, 65536 + 13}) {
          std::fill(dst.begin(), dst.end(), kSentinel);
          copy_bytes(dst.data() + dst_off, src.data() + src_off, n, streaming);
          for (std::size_t i = 0; i < dst.size(); ++i) {
            const bool inside = i >= dst_off && i < dst_off + n;
            const std::byte want = inside ? src[i - dst_off + src_off] : kSentinel;
            ASSERT_EQ(dst[i], want) << "streaming " << streaming << " src+" << src_off << " dst+"
                                    << dst_off << " n=" << n << " at " << i;
          }
        }
      }
    }
  }
}

TEST(FastCopyTest, AddF32DoesNotDependOnHowTheCallsAreSplit) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1e3f, 1e3f);
  std::vector<float> a(1003), b(1003);
  for (float& v : a) v = dist(rng);
  for (float& v : b) v = dist(rng) * 1e-4f;  // sums that round
  std::vector<float> whole = a, split = a;
  add_f32(whole.data(), b.data(), whole.size());
  for (std::size_t at = 0, n = 1; at < split.size(); at += n, n = n * 3 % 37 + 1)
    add_f32(split.data() + at, b.data() + at, std::min(n, split.size() - at));
  for (std::size_t i = 0; i < a.size(); ++i) {
    const float scalar = a[i] + b[i];
    ASSERT_EQ(std::memcmp(&whole[i], &scalar, sizeof(float)), 0) << i;
    ASSERT_EQ(std::memcmp(&split[i], &scalar, sizeof(float)), 0) << i;
  }
}

TEST(FastCopyTest, StreamingThresholdIsAtLeastACacheSizedCopy) {
  EXPECT_GE(streaming_threshold(), std::size_t{1} << 20);
}

// ---------------------------------------------------------------------------------------------
// Transfers

constexpr std::size_t kSlot = 1024;  // small slots: many slot boundaries in little data
constexpr int kSlots = 4;

TEST(ChannelTest, OneThreadMovesEveryLengthBetweenScatteredSegments) {
  ChannelPool pool({0, 0}, kSlot, kSlots);
  const std::size_t lengths[] = {0, 1, 3, kSlot - 1, kSlot, kSlot + 1, 10 * kSlot + 7};
  int source = 0;
  for (std::size_t length : lengths) {
    ++source;
    SCOPED_TRACE(testing::Message() << length << " bytes");
    Scattered src = scattered(length, 700, 100 + source);
    Scattered dst = scattered(length, 1500, 200 + source);
    fill_payload(src, source);
    {
      Transfer t(pool, 0, 1, src.const_segments(), dst.segments());
      EXPECT_EQ(t.bytes(), length);
      EXPECT_EQ(t.done(), length == 0);
      // One caller holding both roles needs no one else: a single pump delivers everything.
      EXPECT_TRUE(t.pump());
      EXPECT_TRUE(t.done());
      EXPECT_TRUE(t.pump());  // pumping a finished transfer is harmless
      EXPECT_LE(t.max_in_flight(), static_cast<std::size_t>(kSlots));
      EXPECT_EQ(t.ring_memory() == nullptr, length == 0);  // empty transfers take no ring
    }
    EXPECT_TRUE(same_bytes(dst.arena, expected_arena(dst, source)));
  }
  // Zero-byte transfers never took a ring; the others ran one after another and shared one.
  EXPECT_EQ(pool.rings(), 1u);
  EXPECT_EQ(pool.rings(0, 1), 1u);
  EXPECT_EQ(pool.ring_bytes(), kSlot * kSlots);
}

TEST(ChannelTest, OneThreadWithBothRolesCopiesOnceWithoutTheSlots) {
  // A lone pump gains nothing from staging the bytes in the ring: it copies each byte once,
  // straight across (bench/README, "One copy for a lone pump"). The ring is still bound, for a
  // second thread that may take a role later.
  ChannelPool pool({0, 0}, kSlot, kSlots);
  const std::size_t length = 3 * kSlot + 5;
  Scattered src = scattered(length, 900, 31);
  fill_payload(src, 7);
  std::byte* slots = nullptr;
  {
    Scattered dst = scattered(length, 1100, 32);
    Transfer first(pool, 0, 1, src.const_segments(), dst.segments());
    EXPECT_TRUE(first.pump(Transfer::Both));
    slots = static_cast<std::byte*>(const_cast<void*>(first.ring_memory()));
    ASSERT_NE(slots, nullptr);
  }
  // The pair's one ring, marked, is the next transfer's.
  std::fill(slots, slots + kSlot * kSlots, std::byte{0xA5});
  Scattered dst = scattered(length, 1100, 33);
  Transfer second(pool, 0, 1, src.const_segments(), dst.segments());
  EXPECT_TRUE(second.pump(Transfer::Both));
  EXPECT_EQ(second.ring_memory(), slots);
  EXPECT_TRUE(same_bytes(dst.arena, expected_arena(dst, 7)));
  for (std::size_t i = 0; i < kSlot * kSlots; ++i)
    ASSERT_EQ(slots[i], std::byte{0xA5}) << "slot byte " << i << " was written";
  EXPECT_EQ(second.max_in_flight(), 0u);
}

TEST(ChannelTest, ProducerAndConsumerThreadsPipelineThroughTheRing) {
  ChannelPool pool({0, 0}, kSlot, kSlots);
  const std::size_t length = 200 * kSlot * kSlots + 5;  // 200 times the ring
  Scattered src = scattered(length, 3000, 1);
  Scattered dst = scattered(length, 5000, 2);
  fill_payload(src, 9);
  Transfer t(pool, 0, 1, src.const_segments(), dst.segments());
  // Alone, the producer fills the ring and returns: the ring is far smaller than the transfer.
  EXPECT_FALSE(t.pump(Transfer::Producer));

  std::thread producer([&] {
    while (!t.pump(Transfer::Producer)) std::this_thread::yield();
  });
  std::thread consumer([&] {
    while (!t.pump(Transfer::Consumer)) std::this_thread::yield();
  });
  producer.join();
  consumer.join();

  EXPECT_TRUE(same_bytes(dst.arena, expected_arena(dst, 9)));
  // Every slot was reused 200 times, and the consumer never saw more full slots than the ring
  // has: the credits held.
  EXPECT_GE(t.max_in_flight(), 1u);
  EXPECT_LE(t.max_in_flight(), static_cast<std::size_t>(kSlots));
}

TEST(ChannelTest, ProducerAloneStopsWhenTheRingIsFull) {
  ChannelPool pool({0, 0}, kSlot, kSlots);
  const std::size_t length = 3 * kSlot * kSlots;
  Scattered src = scattered(length, 900, 3);
  Scattered dst = scattered(length, 900, 4);
  fill_payload(src, 4);
  Transfer t(pool, 0, 1, src.const_segments(), dst.segments());
  EXPECT_FALSE(t.pump(Transfer::Producer));  // fills the ring and returns instead of waiting
  EXPECT_FALSE(t.pump(Transfer::Producer));
  EXPECT_EQ(t.max_in_flight(), 0u);          // nothing consumed yet
  EXPECT_FALSE(t.pump(Transfer::Consumer));  // drains it, then nothing more is produced
  EXPECT_EQ(t.max_in_flight(), static_cast<std::size_t>(kSlots));
  EXPECT_FALSE(t.pump(Transfer::Producer));  // refills the ring
  EXPECT_FALSE(t.done());
  // Both roles: drains the full slots first, in order, then moves the rest alone.
  EXPECT_TRUE(t.pump(Transfer::Both));
  EXPECT_TRUE(same_bytes(dst.arena, expected_arena(dst, 4)));
}

TEST(ChannelTest, AnotherThreadSeesTheDestinationOnceDone) {
  ChannelPool pool({0, 0}, kSlot, kSlots);
  const std::size_t length = 37 * kSlot + 11;
  Scattered src = scattered(length, 2000, 5);
  Scattered dst = scattered(length, 2000, 6);
  fill_payload(src, 5);
  Transfer t(pool, 0, 1, src.const_segments(), dst.segments());
  std::thread pumper([&] { t.pump(); });
  // Reads the destination while the pumper may still be running: done() must order it.
  while (!t.done()) std::this_thread::yield();
  EXPECT_TRUE(same_bytes(dst.arena, expected_arena(dst, 5)));
  pumper.join();
}

TEST(ChannelTest, AddF32AddsSourceToDestinationExactly) {
  ChannelPool pool({0, 0}, kSlot, kSlots);
  const std::size_t floats = 5 * kSlot + 13;  // not a whole number of slots
  Scattered src = scattered(floats * 4, 600, 11, 4);
  Scattered dst = scattered(floats * 4, 1700, 12, 4);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-100.f, 100.f);
  std::vector<float> a(floats), b(floats);
  for (std::size_t i = 0; i < floats; ++i) {
    a[i] = dist(rng);
    b[i] = dist(rng) * 1e-3f + static_cast<float>(i);  // position-dependent, sums that round
    std::memcpy(&dst.arena[dst.where(4 * i)], &a[i], 4);
    std::memcpy(&src.arena[src.where(4 * i)], &b[i], 4);
  }
  std::vector<std::byte> want = dst.arena;
  for (std::size_t i = 0; i < floats; ++i) {
    const float sum = a[i] + b[i];
    std::memcpy(&want[dst.where(4 * i)], &sum, 4);
  }
  for (bool two_threads : {false, true}) {
    SCOPED_TRACE(two_threads ? "producer and consumer threads" : "one thread");
    Scattered out = dst;
    Transfer t(pool, 0, 1, src.const_segments(), out.segments(), Consume::AddF32);
    if (two_threads) {
      std::thread producer([&] {
        while (!t.pump(Transfer::Producer)) std::this_thread::yield();
      });
      while (!t.pump(Transfer::Consumer)) std::this_thread::yield();
      producer.join();
    } else {
      EXPECT_TRUE(t.pump());
    }
    EXPECT_TRUE(same_bytes(out.arena, want));
  }
}

TEST(ChannelTest, ManyThreadsPumpingManyTransfersOnOnePairAllDeliver) {
  ChannelPool pool({0, 0, 0}, kSlot, kSlots);
  constexpr int kTransfers = 4;
  constexpr int kThreads = 3;
  std::vector<Scattered> srcs, dsts;
  for (int i = 0; i < kTransfers; ++i) {
    const std::size_t length = (20 + 7 * i) * kSlot + 3 * i;
    srcs.push_back(scattered(length, 2500, 300 + i));
    dsts.push_back(scattered(length, 1800, 400 + i));
    fill_payload(srcs.back(), 30 + i);
  }
  std::vector<std::unique_ptr<Transfer>> transfers;
  for (int i = 0; i < kTransfers; ++i)
    transfers.push_back(
        std::make_unique<Transfer>(pool, 1, 2, srcs[i].const_segments(), dsts[i].segments()));
  std::vector<std::thread> threads;
  for (int k = 0; k < kThreads; ++k) {
    threads.emplace_back([&, k] {
      // Each thread starts at a different transfer and visits all of them round robin, so
      // roles of one transfer are taken by different threads over time.
      for (bool all_done = false; !all_done;) {
        all_done = true;
        for (int i = 0; i < kTransfers; ++i)
          all_done &= transfers[(i + k) % kTransfers]->pump(Transfer::Both);
        std::this_thread::yield();
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (int i = 0; i < kTransfers; ++i) {
    EXPECT_TRUE(same_bytes(dsts[i].arena, expected_arena(dsts[i], 30 + i))) << "transfer " << i;
    EXPECT_LE(transfers[i]->max_in_flight(), static_cast<std::size_t>(kSlots));
  }
  // Every transfer ran at once: each had a ring of its own, all on the one pair.
  EXPECT_EQ(pool.rings(1, 2), static_cast<std::size_t>(kTransfers));
  EXPECT_EQ(pool.rings(), static_cast<std::size_t>(kTransfers));
  std::vector<const void*> memories;
  for (const auto& t : transfers) memories.push_back(t->ring_memory());
  std::sort(memories.begin(), memories.end());
  EXPECT_EQ(std::unique(memories.begin(), memories.end()), memories.end());
}

TEST(ChannelTest, SecondRingOnlyWhileTwoTransfersOfAPairRunAtOnce) {
  ChannelPool pool({0, 0}, kSlot, kSlots);
  const std::size_t length = 10 * kSlot;
  Scattered src = scattered(length, 1000, 21);
  fill_payload(src, 21);
  auto run_one = [&] {
    Scattered dst = scattered(length, 1000, 22);
    Transfer t(pool, 0, 1, src.const_segments(), dst.segments());
    EXPECT_TRUE(t.pump());
    EXPECT_TRUE(same_bytes(dst.arena, expected_arena(dst, 21)));
  };
  run_one();
  run_one();
  EXPECT_EQ(pool.rings(), 1u);  // one after the other: the ring is reused

  Scattered dst_a = scattered(length, 1000, 23), dst_b = scattered(length, 1000, 24);
  {
    Transfer a(pool, 0, 1, src.const_segments(), dst_a.segments());
    Transfer b(pool, 0, 1, src.const_segments(), dst_b.segments());
    Transfer unbound(pool, 0, 1, src.const_segments(), dst_b.segments());  // never pumped
    EXPECT_FALSE(a.pump(Transfer::Producer));                              // both in flight at once
    EXPECT_FALSE(b.pump(Transfer::Producer));
    EXPECT_EQ(pool.rings(0, 1), 2u);
    EXPECT_NE(a.ring_memory(), b.ring_memory());
    EXPECT_EQ(unbound.ring_memory(), nullptr);
    EXPECT_TRUE(b.pump());
    EXPECT_TRUE(a.pump());
  }
  EXPECT_TRUE(same_bytes(dst_a.arena, expected_arena(dst_a, 21)));
  EXPECT_TRUE(same_bytes(dst_b.arena, expected_arena(dst_b, 21)));
  run_one();
  EXPECT_EQ(pool.rings(), 2u);  // both returned; the next transfer takes one of them
  EXPECT_EQ(pool.ring_bytes(), 2 * kSlot * kSlots);
  EXPECT_EQ(pool.rings(1, 0), 0u);  // the reverse direction is a different channel
  EXPECT_EQ(pool.ring_real_numa(1, 0), -1);
}

// Every small transfer uses slot 0 of its ring. Ring memory is page-aligned, so without a cache
// colour per ring those slots would all fall in one L1 set (8 ways for an 8-rank all-to-all's
// 56 rings): each ring's slots start one line on from the previous ring's.
TEST(ChannelTest, RingsStartInDistinctCacheSets) {
  constexpr int kDevices = 8;
  ChannelPool pool(std::vector<int>(kDevices, 0), kSlot, kSlots);
  std::vector<std::byte> src(64), dst(64 * kDevices * kDevices);
  std::vector<std::unique_ptr<Transfer>> transfers;
  std::vector<std::uintptr_t> sets;
  for (int s = 0; s < kDevices; ++s)
    for (int d = 0; d < kDevices; ++d) {
      if (s == d) continue;
      ConstSegments from{{src.data(), 64}};
      Segments to{{dst.data() + 64 * std::size_t(s * kDevices + d), 64}};
      transfers.push_back(std::make_unique<Transfer>(pool, s, d, from, to));
      ASSERT_TRUE(transfers.back()->pump());
      const auto slot = reinterpret_cast<std::uintptr_t>(transfers.back()->ring_memory());
      EXPECT_EQ(slot % 64, 0u);        // slots stay whole cache lines
      sets.push_back(slot / 64 % 64);  // the L1 set of slot 0 (64 sets of 64-byte lines)
    }
  ASSERT_EQ(pool.rings(), 56u);
  std::sort(sets.begin(), sets.end());
  EXPECT_EQ(std::unique(sets.begin(), sets.end()), sets.end());
}

TEST(ChannelTest, RingLivesOnTheReceiversRealNumaNode) {
  // Device 0 on the highest node, device 1 on node 0, device 2 unknown (node 0).
  const int last = numa::node_count() - 1;
  ChannelPool pool({0, last, -1}, kSlot, kSlots);
  Scattered src = scattered(9 * kSlot, 1000, 31);
  fill_payload(src, 31);
  for (auto [from, to, node] : {std::tuple{0, 1, last}, std::tuple{1, 0, 0}, std::tuple{0, 2, 0}}) {
    SCOPED_TRACE(testing::Message() << from << " -> " << to);
    Scattered dst = scattered(9 * kSlot, 1000, 32);
    Transfer t(pool, from, to, src.const_segments(), dst.segments());
    EXPECT_EQ(pool.ring_real_numa(from, to), -1);
    EXPECT_TRUE(t.pump());
    EXPECT_TRUE(same_bytes(dst.arena, expected_arena(dst, 31)));
    ASSERT_NE(t.ring_memory(), nullptr);
    if (!numa::available()) GTEST_SKIP() << "libnuma unusable: ring placement cannot be read";
    EXPECT_EQ(numa::node_of(t.ring_memory()), node);
    EXPECT_EQ(pool.ring_real_numa(from, to), node);
  }
}

TEST(ChannelTest, PoolRejectsANodeTheHostDoesNotHave) {
  EXPECT_THROW(ChannelPool({0, numa::node_count() + 2}), HostError);
}

TEST(ChannelTest, SelfTransferCopiesWithoutARing) {
  ChannelPool pool({0, 0}, kSlot, kSlots);
  const std::size_t length = 10 * kSlot + 7;
  Scattered src = scattered(length, 900, 41);
  Scattered dst = scattered(length, 1300, 42);
  fill_payload(src, 41);
  {
    Transfer t(pool, 1, 1, src.const_segments(), dst.segments());
    EXPECT_FALSE(t.done());
    EXPECT_TRUE(t.pump(Transfer::Consumer));  // any role moves a local transfer
    EXPECT_TRUE(t.done());
    EXPECT_EQ(t.ring_memory(), nullptr);
  }
  EXPECT_TRUE(same_bytes(dst.arena, expected_arena(dst, 41)));

  // Accumulating onto itself doubles every float.
  std::vector<float> v = {1.5f, -2.25f, 3.0f, 1e-3f};
  std::vector<float> copy = v;
  {
    Transfer t(
        pool, 0, 0, {{reinterpret_cast<const std::byte*>(copy.data()), 16}},
        {{reinterpret_cast<std::byte*>(v.data()), 8}, {reinterpret_cast<std::byte*>(&v[2]), 8}},
        Consume::AddF32);
    EXPECT_TRUE(t.pump());
  }
  EXPECT_EQ(v, (std::vector<float>{3.0f, -4.5f, 6.0f, 2e-3f}));
  EXPECT_EQ(pool.rings(), 0u);
}

TEST(ChannelTest, LargeTransferWithStreamingStoresDeliversEveryByte) {
  // At the streaming threshold the consumer writes with non-temporal stores; odd segment sizes
  // and misaligned destinations exercise their head and tail handling.
  ChannelPool pool({0, 0});
  const std::size_t length = streaming_threshold() + 13;
  Scattered src = scattered(length, 3 << 20, 51);
  Scattered dst = scattered(length, 1 << 20, 52);
  fill_payload(src, 51);
  Transfer t(pool, 0, 1, src.const_segments(), dst.segments());
  std::thread helper([&] {
    while (!t.pump(Transfer::Producer)) std::this_thread::yield();
  });
  while (!t.pump(Transfer::Both)) std::this_thread::yield();
  helper.join();
  EXPECT_TRUE(same_bytes(dst.arena, expected_arena(dst, 51)));
  EXPECT_EQ(pool.ring_bytes(), pool.slot_bytes() * static_cast<std::size_t>(pool.slots()));
}

// The streaming choice is the collective's: a 1 MiB transfer streams when it is one of many
// whose source and destination together pass twice the threshold, and still delivers every byte.
TEST(ChannelTest, ATransferStreamsWhenItsCollectivesFootprintIsLarge) {
  ChannelPool pool({0, 0});
  const std::size_t length = std::size_t{1} << 20;
  Scattered src = scattered(length, length, 61);
  Scattered dst = scattered(length, length, 62);
  fill_payload(src, 61);
  Transfer alone(pool, 0, 1, src.const_segments(), dst.segments());
  EXPECT_FALSE(alone.streams());
  Transfer part(pool, 0, 1, src.const_segments(), dst.segments(), Consume::Copy,
                2 * streaming_threshold());
  EXPECT_TRUE(part.streams());
  while (!part.pump(Transfer::Both)) std::this_thread::yield();
  EXPECT_TRUE(same_bytes(dst.arena, expected_arena(dst, 61)));
}

}  // namespace
}  // namespace nodeemu::detail
