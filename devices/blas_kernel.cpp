#include "devices/blas_kernel.hpp"

#include <cpuid.h>

#include <cstdlib>
#include <mutex>

// OpenBLAS's exported entry points for its dynamic-arch dispatch. gotoblas_dynamic_init() reads
// OPENBLAS_CORETYPE (or CPUID) and installs the kernel table; gotoblas_dynamic_quit() clears it.
extern "C" {
char* openblas_get_corename(void);
char* openblas_get_config(void);
void openblas_set_num_threads(int);
int openblas_get_num_threads(void);
void gotoblas_dynamic_init(void);
void gotoblas_dynamic_quit(void);
int blas_thread_shutdown_(void);
}

namespace nodeemu::blas {
namespace {

std::uint64_t read_xcr0() {
  std::uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<std::uint64_t>(hi) << 32) | lo;
}

std::string current_corename() {
  const char* n = openblas_get_corename();
  return n ? std::string(n) : std::string("unknown");
}

}  // namespace

CpuFeatures CpuFeatures::detect() {
  CpuFeatures f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  bool osxsave = c & bit_OSXSAVE;
  f.avx = c & bit_AVX;
  f.fma = c & bit_FMA;
  if (osxsave) {
    std::uint64_t xcr0 = read_xcr0();
    f.os_saves_avx = (xcr0 & 0x6) == 0x6;
    f.os_saves_avx512 = (xcr0 & 0xe6) == 0xe6;
  }
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
    f.avx2 = b & bit_AVX2;
    f.avx512f = b & bit_AVX512F;
    f.avx512dq = b & bit_AVX512DQ;
    f.avx512cd = b & bit_AVX512CD;
    f.avx512bw = b & bit_AVX512BW;
    f.avx512vl = b & bit_AVX512VL;
  }
  if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) f.avx512_bf16 = a & (1u << 5);
  return f;
}

std::string best_kernel_for(const CpuFeatures& f) {
  bool avx512 =
      f.os_saves_avx512 && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.avx512cd;
  if (avx512 && f.avx512_bf16) return "Cooperlake";
  if (avx512) return "SkylakeX";
  if (f.os_saves_avx && f.avx2 && f.fma) return "Haswell";
  if (f.os_saves_avx && f.avx) return "Sandybridge";
  return "Prescott";
}

int kernel_rank(const std::string& name) {
  // Families by the widest SIMD their SGEMM kernels use. Zen and Excavator run AVX2 kernels.
  static const std::pair<const char*, int> ranks[] = {
      {"Cooperlake", 50}, {"SapphireRapids", 50}, {"SkylakeX", 40},    {"Haswell", 30},
      {"Zen", 30},        {"Excavator", 25},      {"Sandybridge", 20}, {"Steamroller", 20},
      {"Piledriver", 20}, {"Bulldozer", 15}};
  for (auto& [n, r] : ranks)
    if (name == n) return r;
  return 0;
}

std::string KernelChoice::describe() const {
  std::string s = "OpenBLAS kernel " + kernel;
  if (corrected)
    s += " (OpenBLAS picked " + openblas_pick + "; corrected by NodeEmu)";
  else if (user_forced)
    s += " (OPENBLAS_CORETYPE set by the user)";
  else
    s += " (OpenBLAS's own pick)";
  if (!corrected && !user_forced && kernel_rank(kernel) < kernel_rank(best))
    s += "; this CPU could run " + best;
  s += ", " + std::to_string(threads) + " thread per call";
  return s;
}

namespace detail {

std::string force_kernel(const std::string& name) {
  // OpenBLAS re-reads OPENBLAS_CORETYPE in gotoblas_dynamic_init; restore the user's setting
  // afterwards so that a child process sees what the user set.
  const char* prev = std::getenv("OPENBLAS_CORETYPE");
  std::string saved = prev ? prev : "";
  setenv("OPENBLAS_CORETYPE", name.c_str(), 1);
  gotoblas_dynamic_quit();
  gotoblas_dynamic_init();
  if (prev)
    setenv("OPENBLAS_CORETYPE", saved.c_str(), 1);
  else
    unsetenv("OPENBLAS_CORETYPE");
  return current_corename();
}

KernelChoice reselect(bool ignore_env) {
  KernelChoice k;
  k.best = best_kernel_for(CpuFeatures::detect());
  k.openblas_pick = current_corename();
  k.user_forced = !ignore_env && std::getenv("OPENBLAS_CORETYPE") != nullptr;
  if (!k.user_forced && kernel_rank(k.openblas_pick) < kernel_rank(k.best)) {
    std::string now = force_kernel(k.best);
    k.corrected = (now == k.best);
  }
  k.kernel = current_corename();
  openblas_set_num_threads(1);
  // OpenBLAS starts a server thread per core at load time, and they busy-wait for work for a
  // while (about 75 ms of CPU measured here) before sleeping. With one thread per call they are
  // never used, so stop them: on 2 cores they would steal a core from the emulated GPUs.
  blas_thread_shutdown_();
  k.threads = openblas_get_num_threads();
  const char* cfg = openblas_get_config();
  k.config = cfg ? cfg : "";
  return k;
}

}  // namespace detail

const KernelChoice& ensure_best_kernel() {
  static KernelChoice choice;
  static std::once_flag once;
  std::call_once(once, [] { choice = detail::reselect(false); });
  return choice;
}

}  // namespace nodeemu::blas
