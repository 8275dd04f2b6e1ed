#include "devices/wake_word.hpp"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <thread>

namespace nodeemu {
namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// How long an idle thread keeps polling before it sleeps. Short enough that an idle emulated
// GPU costs nothing measurable, long enough to cover the gap between back-to-back launches.
constexpr auto kSpinFor = std::chrono::microseconds(50);

// At most half the hardware threads spin at once. Emulated devices outnumber real cores many
// times over (16 pools and 16 host threads on 2 cores): when every idle thread spun, the spinners
// took the cores from the one thread moving bytes, and a 64-byte all-to-all on 8 ranks cost
// half a millisecond.
std::atomic<int> g_spinners{0};
const int g_max_spinners = [] {
  const int hw = static_cast<int>(std::thread::hardware_concurrency());
  return hw > 1 ? hw / 2 : 0;
}();

// The futex calls on the word's own address, process-private. A 32-bit std::atomic has the
// layout of its value, which is what the kernel compares.
void futex_wait(const std::atomic<std::uint32_t>& word, std::uint32_t seen) {
  syscall(SYS_futex, reinterpret_cast<const std::uint32_t*>(&word), FUTEX_WAIT_PRIVATE, seen,
          nullptr, nullptr, 0);
}

void futex_wake(const std::atomic<std::uint32_t>& word, int count) {
  syscall(SYS_futex, reinterpret_cast<const std::uint32_t*>(&word), FUTEX_WAKE_PRIVATE, count,
          nullptr, nullptr, 0);
}

static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t) &&
              std::atomic<std::uint32_t>::is_always_lock_free);

}  // namespace

void WakeWord::store(std::uint32_t value, bool all) {
  word_.store(value, std::memory_order_seq_cst);
  wake(all);
}

void WakeWord::bump(bool all) {
  word_.fetch_add(1, std::memory_order_seq_cst);
  wake(all);
}

void WakeWord::wake(bool all) {
  // Sequentially consistent with the waiter's count-then-recheck: either this load sees the
  // sleeper, or the sleeper's recheck sees the new value and does not sleep.
  if (sleepers_.load(std::memory_order_seq_cst) == 0) return;
  wakes_.fetch_add(1, std::memory_order_relaxed);
  futex_wake(word_, all ? INT_MAX : 1);
}

void WakeWord::wait_while(std::uint32_t seen) const {
  if (word_.load(std::memory_order_acquire) != seen) return;
  if (g_spinners.fetch_add(1, std::memory_order_relaxed) < g_max_spinners) {
    const auto deadline = std::chrono::steady_clock::now() + kSpinFor;
    int n = 0;
    while (word_.load(std::memory_order_acquire) == seen) {
      cpu_relax();
      if ((++n & 63) == 0 && std::chrono::steady_clock::now() >= deadline) break;
    }
  }
  g_spinners.fetch_sub(1, std::memory_order_relaxed);
  if (word_.load(std::memory_order_acquire) != seen) return;
  sleepers_.fetch_add(1, std::memory_order_seq_cst);
  // The kernel sleeps only while the word still holds `seen`; spurious and interrupted wakes
  // come back here.
  while (word_.load(std::memory_order_seq_cst) == seen) futex_wait(word_, seen);
  sleepers_.fetch_sub(1, std::memory_order_relaxed);
}

}  // namespace nodeemu
