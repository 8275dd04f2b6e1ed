// Which OpenBLAS kernel family runs NodeEmu's GEMMs.
//
// NodeEmu's numerics promises rest on the GEMM: a row's outputs must not depend on how many rows
// a call has (the fixed row chunks; moe_grouped_gemm on or off) nor on the weight's layout (the
// kept transposed expert weights, layers/transposed_weight_copy.hpp). OpenBLAS 0.3.21's Haswell
// kernels keep both. Its SkylakeX and Cooperlake kernels do not: below about 10^6 multiply-adds
// they take small-matrix and direct paths whose summation order differs by layout and size
// (measured: a 1 x 128 x 16 forward on [in][out] weights differs from the one on [out][in]).
// So NodeEmu runs the Haswell kernels on every CPU with AVX2 and FMA, AVX-512 ones included: the
// same kernel, and so the same numerics hash, whichever x86 host CI lands on. The price on an
// AVX-512 host is about a third of sgemm's speed (bench/README.md). A CPU without AVX2 runs the
// best it has (no small-matrix paths below SkylakeX).
//
// OpenBLAS 0.3.21 built with DYNAMIC_ARCH (Debian's) picks its kernels from CPUID at load time,
// and on some virtual machines falls back to the generic "Prescott" kernels: NodeEmu re-runs
// OpenBLAS's own dynamic selection with OPENBLAS_CORETYPE set whenever OpenBLAS picked another
// family. An explicit OPENBLAS_CORETYPE from the user is always respected (then the transposed
// weight copy is not kept, and describe() says the numerics may differ from other hosts').
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

// The OpenBLAS 0.3.21 x86-64 kernel family NodeEmu runs on a CPU with these features, by
// OpenBLAS's names: "Haswell", "Sandybridge" or "Prescott" (see above).
std::string kernel_for(const CpuFeatures& f);

// Whether a kernel family's results are independent of a GEMM's row count and its operands'
// layouts (what the numerics promises above need).
bool layout_independent(const std::string& openblas_corename);

struct KernelChoice {
  std::string kernel;         // what OpenBLAS runs now (openblas_get_corename)
  std::string openblas_pick;  // what OpenBLAS picked by itself at load time
  std::string wanted;         // what NodeEmu runs on this CPU (kernel_for)
  bool corrected = false;     // NodeEmu switched OpenBLAS to `wanted`
  bool user_forced = false;   // OPENBLAS_CORETYPE was set by the user
  int threads = 1;            // OpenBLAS threads per call (NodeEmu parallelises itself)
  std::string config;         // openblas_get_config()
  std::string describe() const;
  // The running kernel keeps the numerics promises (layout_independent(kernel)).
  bool layout_independent() const;
};

// Checks and, if needed, switches OpenBLAS to the wanted kernel, and sets OpenBLAS to one thread
// per call: NodeEmu's worker pools split GEMMs themselves with a fixed partition, so that results
// never depend on the thread count. Idempotent and thread-safe; the first call decides and must
// come before any BLAS work (Node's constructor makes it).
const KernelChoice& ensure_kernel();

namespace detail {
// Runs OpenBLAS's dynamic kernel selection again as if OPENBLAS_CORETYPE were `name`.
// Returns what OpenBLAS now reports. For tests that reproduce a bad pick.
std::string force_kernel(const std::string& name);
// Re-runs the decision of ensure_kernel() (ignoring an earlier decision), treating the
// environment's OPENBLAS_CORETYPE as unset when `ignore_env` is true.
KernelChoice reselect(bool ignore_env);
}  // namespace detail

}  // namespace nodeemu::blas
