#include "devices/numa_memory.hpp"

#include <gtest/gtest.h>
#include <numa.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "devices/errors.hpp"
#include "devices/sanitizers.hpp"

namespace nodeemu::numa {
namespace {

// AddressSanitizer and ThreadSanitizer turn mlock/munlock into no-ops that report success, so the
// kernel's count of locked memory cannot be checked in such a build.
constexpr bool kMlockIsReal = !(NODEEMU_UNDER_ASAN || NODEEMU_UNDER_TSAN);

const std::size_t kPage = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));

// A node number that is not on this host.
int missing_node() {
  return node_count() + 3;
}

// Whether [ptr, ptr + bytes) is still mapped: mincore fails with ENOMEM on unmapped ranges.
bool is_mapped(void* ptr, std::size_t bytes) {
  std::vector<unsigned char> pages((bytes + kPage - 1) / kPage);
  if (mincore(ptr, bytes, pages.data()) == 0) return true;
  EXPECT_EQ(errno, ENOMEM);
  return false;
}

// Memory this process has locked, from /proc/self/status, in KiB.
long locked_kib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmLck:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

bool all_zero(const Placement& p) {
  const auto* bytes = static_cast<const unsigned char*>(p.ptr);
  for (std::size_t i = 0; i < p.bytes; ++i)
    if (bytes[i] != 0) return false;
  return true;
}

TEST(NumaNodes, NodeZeroAlwaysExists) {
  EXPECT_GE(node_count(), 1);
  EXPECT_TRUE(node_exists(0));
  EXPECT_FALSE(node_exists(-1));
  EXPECT_FALSE(node_exists(missing_node()));
}

TEST(NumaAllocate, LandsOnNodeZero) {
  if (!available()) GTEST_SKIP() << "libnuma is not usable here; placement is unknown";
  const std::size_t bytes = (1 << 20) + 123;
  Placement p = allocate_on_node(bytes, 0);
  ASSERT_NE(p.ptr, nullptr);
  EXPECT_EQ(p.bytes, bytes);
  EXPECT_EQ(p.requested_node, 0);
  EXPECT_EQ(p.actual_node, 0);
  EXPECT_FALSE(p.locked);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p.ptr) % kPage, 0u);
  auto* last = static_cast<unsigned char*>(p.ptr) + bytes - 1;
  EXPECT_EQ(node_of(p.ptr), 0);
  EXPECT_EQ(node_of(last), 0);  // every page was touched, not only the first
  release(p);
}

TEST(NumaAllocate, IsZeroFilled) {
  const std::size_t bytes = 3 * kPage + 17;
  Placement first = allocate_on_node(bytes, 0);
  ASSERT_NE(first.ptr, nullptr);
  EXPECT_TRUE(all_zero(first));
  std::memset(first.ptr, 0xAB, bytes);
  release(first);
  // A second allocation may reuse the same pages; it must still come back zeroed.
  Placement second = allocate_on_node(bytes, 0);
  ASSERT_NE(second.ptr, nullptr);
  EXPECT_TRUE(all_zero(second));
  release(second);
}

TEST(NumaAllocate, MissingNodeIsHostErrorAndSilent) {
  const int node = missing_node();
  ASSERT_FALSE(node_exists(node));
  for (bool pinned : {false, true}) {
    std::string message;
    ::testing::internal::CaptureStderr();
    try {
      Placement p = pinned ? allocate_pinned_on_node(kPage, node) : allocate_on_node(kPage, node);
      release(p);
    } catch (const HostError& e) {
      message = e.what();
    }
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(err, "");
    EXPECT_NE(message.find("node " + std::to_string(node) + " does not exist"), std::string::npos)
        << "pinned=" << pinned << ": " << message;
  }
}

TEST(NumaAllocate, LibnumaWarningsAreCapturedNotPrinted) {
  if (!available()) GTEST_SKIP() << "libnuma is not usable here";
  // Straight to libnuma, bypassing the node check: this is the call that complains.
  ::testing::internal::CaptureStderr();
  void* raw = numa_alloc_onnode(kPage, missing_node());
  const std::string err = ::testing::internal::GetCapturedStderr();
  if (raw != nullptr) numa_free(raw, kPage);
  EXPECT_EQ(err, "");
  EXPECT_NE(last_warning().find("mbind"), std::string::npos) << last_warning();
  EXPECT_EQ(last_warning().find('\n'), std::string::npos);
}

TEST(NumaAllocate, PinnedIsLockedAndReleaseFreesIt) {
  const std::size_t bytes = 64 * kPage;
  rlimit limit{};
  ASSERT_EQ(getrlimit(RLIMIT_MEMLOCK, &limit), 0);
  const long before = locked_kib();

  Placement p = allocate_pinned_on_node(bytes, 0);
  ASSERT_NE(p.ptr, nullptr);
  EXPECT_TRUE(all_zero(p));
  if (available()) {
    EXPECT_EQ(p.actual_node, 0);
  }
  if (limit.rlim_cur == RLIM_INFINITY || limit.rlim_cur >= 4 * bytes) {
    EXPECT_TRUE(p.locked) << "RLIMIT_MEMLOCK allows it";
  }
  if (p.locked && kMlockIsReal) {
    EXPECT_GE(locked_kib() - before, static_cast<long>(bytes / 1024));
  }

  release(p);
  EXPECT_EQ(locked_kib(), before);
  EXPECT_FALSE(is_mapped(p.ptr, bytes));
}

TEST(NumaAllocate, ReleaseUnmaps) {
  Placement p = allocate_on_node(5 * kPage, 0);
  ASSERT_NE(p.ptr, nullptr);
  EXPECT_TRUE(is_mapped(p.ptr, p.bytes));
  release(p);
  EXPECT_FALSE(is_mapped(p.ptr, p.bytes));
}

TEST(NumaAllocate, RecycledBlocksAreReusedZeroFilledOnTheirNode) {
  Placement p = allocate_on_node(7 * kPage, 0);
  static_cast<char*>(p.ptr)[100] = 42;
  recycle(p);
  EXPECT_TRUE(is_mapped(p.ptr, p.bytes));  // kept
  Placement q = allocate_on_node(7 * kPage, 0);
  EXPECT_EQ(q.ptr, p.ptr);
  EXPECT_EQ(q.actual_node, p.actual_node);
  EXPECT_EQ(static_cast<char*>(q.ptr)[100], 0);  // zero-filled again
  release(q);
  EXPECT_FALSE(is_mapped(q.ptr, q.bytes));
}

TEST(NumaAllocate, ZeroBytesIsANullPlacement) {
  Placement p = allocate_on_node(0, 0);
  EXPECT_EQ(p.ptr, nullptr);
  EXPECT_EQ(p.requested_node, 0);
  release(p);  // accepted, does nothing
}

TEST(NumaNodeOf, UnknownForNullAndUntouchedPages) {
  EXPECT_EQ(node_of(nullptr), -1);
  void* untouched =
      mmap(nullptr, kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(untouched, MAP_FAILED);
  EXPECT_EQ(node_of(untouched), -1);  // no page behind it yet
  munmap(untouched, kPage);
}

}  // namespace
}  // namespace nodeemu::numa
