// Internal (layers/parameter.cpp): a weight's initial values, std * counter_normal(seed, stream,
// index) rounded to fp32, many at a time.
//
// Why: counter_normal's Box-Muller takes a libm `log` and `cos` per value, scalar; drawing a
// mid-size model's weights was 10 % of a two-iteration functional run and 20 % of a one-iteration
// one (bench_emu BM_FunctionalMidSize's recipe), all before the first step. Where the CPU has
// AVX-512 (F, DQ and VL), eight values are made at once: the counters and the uniforms with the
// same integer and IEEE operations as counter_normal (so the same doubles), and `log` and `cos` by
// polynomials whose result is within 2^-46 of the true value, relative. A value only keeps the
// fast result when it lies more than 2^-40 (relative) from the nearest point where fp32 rounding
// changes: counter_normal's own result (libm's `log` and `cos` are within an ulp or so) then
// rounds to the same float. Otherwise, and where the reduced angle is too small for the bound
// (cos near a zero), that value is drawn by counter_normal itself. The values are the same bits
// on every CPU and every path; about one in 40,000 takes the slow path.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>

namespace nodeemu::layers::detail {

enum class NormalFillPath {
  Portable,  // counter_normal, one value at a time
  Avx512,    // AVX-512 F/DQ/VL: eight at a time, with the exact fallback above
};

bool normal_fill_path_runs_here(NormalFillPath path);

// out[i] = float(std * counter_normal(seed, stream, global(first + i))) for i in [0, n).
// Returns how many values took the slow path (all of them on the portable path).
std::size_t fill_counter_normals(std::uint64_t seed, std::uint64_t stream, double std,
                                 const std::function<std::int64_t(std::int64_t)>& global,
                                 std::int64_t first, std::size_t n, float* out,
                                 NormalFillPath path);
// The same on the fastest path this CPU runs.
std::size_t fill_counter_normals(std::uint64_t seed, std::uint64_t stream, double std,
                                 const std::function<std::int64_t(std::int64_t)>& global,
                                 std::int64_t first, std::size_t n, float* out);

}  // namespace nodeemu::layers::detail
