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

std::string kernel_for(const CpuFeatures& f) {
  // AVX-512 hosts run the AVX2 kernels too: SkylakeX's and Cooperlake's small-matrix paths break
  // the numerics promises (blas_kernel.hpp).
  if (f.os_saves_avx && f.avx2 && f.fma) return "Haswell";
  if (f.os_saves_avx && f.avx) return "Sandybridge";
  return "Prescott";
}

bool layout_independent(const std::string& name) {
  // The families without OpenBLAS 0.3.21's small-matrix and direct sgemm paths (x86-64: only
  // SkylakeX and Cooperlake have them); Zen runs the Haswell kernels.
  return name == "Haswell" || name == "Zen" || name == "Sandybridge" || name == "Prescott";
}

std::string KernelChoice::describe() const {
  std::string s = "OpenBLAS kernel " + kernel;
  if (corrected)
    s += " (OpenBLAS picked " + openblas_pick + "; NodeEmu runs " + wanted + ")";
  else if (user_forced)
    s += " (OPENBLAS_CORETYPE set by the user)";
  else
    s += " (OpenBLAS's own pick)";
  if (!layout_independent())
    s += "; its results depend on a GEMM's size and layout, so the numerics may differ from " +
         wanted + "'s and the transposed expert weights are not kept";
  s += ", " + std::to_string(threads) + " thread per call";
  return s;
}

bool KernelChoice::layout_independent() const {
  return blas::layout_independent(kernel);
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
  k.wanted = kernel_for(CpuFeatures::detect());
  k.openblas_pick = current_corename();
  k.user_forced = !ignore_env && std::getenv("OPENBLAS_CORETYPE") != nullptr;
  if (!k.user_forced && k.openblas_pick != k.wanted) {
    std::string now = force_kernel(k.wanted);
    k.corrected = (now == k.wanted);
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

const KernelChoice& ensure_kernel() {
  static KernelChoice choice;
  static std::once_flag once;
  std::call_once(once, [] { choice = detail::reselect(false); });
  return choice;
}

}  // namespace nodeemu::blas
