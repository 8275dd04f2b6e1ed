// Which OpenBLAS kernel family runs NodeEmu's GEMMs, and fixing a bad choice.
//
// OpenBLAS 0.3.21 built with DYNAMIC_ARCH (Debian's) picks its kernels from CPUID at load time,
// and on some virtual machines it falls back to the generic "Prescott" kernels although the CPU
// has AVX-512: about 32 GFLOP/s per core instead of about 150, a 5x loss on exactly the machines
// CI runs on. NodeEmu compares OpenBLAS's choice with what CPUID says the core can run and, when
// OpenBLAS chose worse, re-runs OpenBLAS's own dynamic selection with OPENBLAS_CORETYPE set.
// An explicit OPENBLAS_CORETYPE from the user is always respected.
#pragma once

#include <string>

namespace nodeemu::blas {

// What CPUID reports, reduced to what the OpenBLAS x86-64 kernel families need.
struct CpuFeatures {
  bool avx = false, avx2 = false, fma = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false, avx512cd = false;
  bool avx512_bf16 = false;
  bool os_saves_avx = false;     // XCR0 enables YMM state
  bool os_saves_avx512 = false;  // XCR0 enables opmask and ZMM state
  static CpuFeatures detect();
};

// The best OpenBLAS 0.3.21 x86-64 kernel family these features can run, by OpenBLAS's names:
// "Cooperlake", "SkylakeX", "Haswell", "Sandybridge" or "Prescott".
std::string best_kernel_for(const CpuFeatures& f);

// A rank for comparing kernel families by the instructions they use (higher is better);
// unknown names rank as generic.
int kernel_rank(const std::string& openblas_corename);

struct KernelChoice {
  std::string kernel;         // what OpenBLAS runs now (openblas_get_corename)
  std::string openblas_pick;  // what OpenBLAS picked by itself at load time
  std::string best;           // what the CPU could run
  bool corrected = false;     // NodeEmu switched OpenBLAS to `best`
  bool user_forced = false;   // OPENBLAS_CORETYPE was set by the user
  int threads = 1;            // OpenBLAS threads per call (NodeEmu parallelises itself)
  std::string config;         // openblas_get_config()
  std::string describe() const;
};

// Checks and, if needed, corrects OpenBLAS's kernel choice, and sets OpenBLAS to one thread per
// call: NodeEmu's worker pools split GEMMs themselves with a fixed partition, so that results
// never depend on the thread count. Idempotent and thread-safe; the first call decides and must
// come before any BLAS work (Node's constructor makes it).
const KernelChoice& ensure_best_kernel();

namespace detail {
// Runs OpenBLAS's dynamic kernel selection again as if OPENBLAS_CORETYPE were `name`.
// Returns what OpenBLAS now reports. For tests that reproduce a bad pick.
std::string force_kernel(const std::string& name);
// Re-runs the decision of ensure_best_kernel() (ignoring an earlier decision), treating the
// environment's OPENBLAS_CORETYPE as unset when `ignore_env` is true.
KernelChoice reselect(bool ignore_env);
}  // namespace detail

}  // namespace nodeemu::blas
