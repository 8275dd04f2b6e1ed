// OpenBLAS's kernel choice: a generic pick on a CPU with AVX-512 is noticed and corrected.
#include "devices/blas_kernel.hpp"

#include <gtest/gtest.h>

namespace nodeemu::blas {
namespace {

TEST(BlasKernel, BestKernelFollowsCpuid) {
  CpuFeatures f;
  EXPECT_EQ(best_kernel_for(f), "Prescott");
  f.avx = f.os_saves_avx = true;
  EXPECT_EQ(best_kernel_for(f), "Sandybridge");
  f.avx2 = f.fma = true;
  EXPECT_EQ(best_kernel_for(f), "Haswell");
  f.avx512f = f.avx512bw = f.avx512vl = f.avx512dq = f.avx512cd = true;
  EXPECT_EQ(best_kernel_for(f), "Haswell");  // the OS does not save ZMM state
  f.os_saves_avx512 = true;
  EXPECT_EQ(best_kernel_for(f), "SkylakeX");
  f.avx512_bf16 = true;
  EXPECT_EQ(best_kernel_for(f), "Cooperlake");
  EXPECT_LT(kernel_rank("Prescott"), kernel_rank("Haswell"));
  EXPECT_EQ(kernel_rank("Zen"), kernel_rank("Haswell"));
}

TEST(BlasKernel, AGenericPickIsCorrected) {
  const std::string best = best_kernel_for(CpuFeatures::detect());
  // Reproduce what OpenBLAS 0.3.21 does on some VMs: fall back to Prescott.
  ASSERT_EQ(detail::force_kernel("Prescott"), "Prescott");
  KernelChoice k = detail::reselect(/*ignore_env=*/true);
  EXPECT_EQ(k.openblas_pick, "Prescott");
  EXPECT_EQ(k.kernel, best);
  EXPECT_EQ(k.corrected, best != "Prescott");
  EXPECT_EQ(k.threads, 1);
  EXPECT_NE(k.describe().find("corrected"), std::string::npos) << k.describe();
}

TEST(BlasKernel, ProcessChoiceIsNeverWorseThanTheCpuAllows) {
  const KernelChoice& k = ensure_best_kernel();
  if (!k.user_forced) {
    EXPECT_GE(kernel_rank(k.kernel), kernel_rank(k.best)) << k.describe();
  }
  EXPECT_NE(k.describe().find(k.kernel), std::string::npos);
}

}  // namespace
}  // namespace nodeemu::blas
