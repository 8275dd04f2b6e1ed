// OpenBLAS's kernel choice: NodeEmu runs the kernel whose results keep its numerics promises, and
// switches OpenBLAS to it whatever OpenBLAS picked (a generic fallback, or the AVX-512 kernels).
#include "devices/blas_kernel.hpp"

#include <gtest/gtest.h>

#include <cstdlib>

namespace nodeemu::blas {
namespace {

TEST(BlasKernel, WantedKernelFollowsCpuid) {
  CpuFeatures f;
  EXPECT_EQ(kernel_for(f), "Prescott");
  f.avx = f.os_saves_avx = true;
  EXPECT_EQ(kernel_for(f), "Sandybridge");
  f.avx2 = f.fma = true;
  EXPECT_EQ(kernel_for(f), "Haswell");
  // AVX-512 hosts run the AVX2 kernels: the same numerics as every other x86 host.
  f.avx512f = f.avx512bw = f.avx512vl = f.avx512dq = f.avx512cd = f.os_saves_avx512 = true;
  EXPECT_EQ(kernel_for(f), "Haswell");
  f.avx512_bf16 = true;
  EXPECT_EQ(kernel_for(f), "Haswell");
  EXPECT_TRUE(layout_independent("Haswell"));
  EXPECT_TRUE(layout_independent("Zen"));
  EXPECT_FALSE(layout_independent("SkylakeX"));
  EXPECT_FALSE(layout_independent("Cooperlake"));
}

// What OpenBLAS 0.3.21 does by itself: a generic fallback on some VMs, its AVX-512 kernels on an
// AVX-512 host. Either way NodeEmu runs the wanted kernel.
TEST(BlasKernel, AnotherPickIsCorrected) {
  const std::string wanted = kernel_for(CpuFeatures::detect());
  for (const char* pick : {"Prescott", "SkylakeX"}) {
    if (std::string(pick) == "SkylakeX" && wanted != "Haswell") continue;  // needs AVX2
    const std::string got = detail::force_kernel(pick);
    if (got != pick) continue;  // OpenBLAS refuses a kernel this CPU cannot run
    KernelChoice k = detail::reselect(/*ignore_env=*/true);
    EXPECT_EQ(k.openblas_pick, pick);
    EXPECT_EQ(k.kernel, wanted);
    EXPECT_EQ(k.corrected, wanted != pick);
    EXPECT_TRUE(k.layout_independent());
    EXPECT_EQ(k.threads, 1);
    EXPECT_NE(k.describe().find("NodeEmu runs " + wanted), std::string::npos) << k.describe();
  }
  EXPECT_EQ(detail::reselect(/*ignore_env=*/true).kernel, wanted);  // whatever was skipped
}

TEST(BlasKernel, TheProcessRunsTheWantedKernelUnlessTheUserSetOne) {
  const KernelChoice& k = ensure_kernel();
  if (!k.user_forced) {
    EXPECT_EQ(k.kernel, k.wanted) << k.describe();
    EXPECT_TRUE(k.layout_independent());
  }
  EXPECT_NE(k.describe().find(k.kernel), std::string::npos);
}

TEST(BlasKernel, AUsersKernelThatBreaksThePromisesIsSaidSo) {
  KernelChoice k;
  k.kernel = k.openblas_pick = "SkylakeX";
  k.wanted = "Haswell";
  k.user_forced = true;
  EXPECT_FALSE(k.layout_independent());
  EXPECT_NE(k.describe().find("numerics may differ"), std::string::npos) << k.describe();
}

}  // namespace
}  // namespace nodeemu::blas
