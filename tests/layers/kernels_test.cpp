// Every kernel's backward against central finite differences, in fp64 (the kernels are templates
// on the compute type; the model runs them in fp32). With h = 1e-5 the central difference's
// truncation error is O(h^2) ~ 1e-10 and its rounding error ~ 1e-16 / h ~ 1e-11, so a relative
// tolerance of 1e-6 leaves three orders of magnitude of headroom while catching any wrong term.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

#include "layers/gemm.hpp"
#include "layers/kernels/attention.hpp"
#include "layers/kernels/rmsnorm.hpp"
#include "layers/kernels/swiglu.hpp"
#include "layers/kernels/vocab.hpp"
#include "layers/router.hpp"

namespace nodeemu::layers {
namespace {

using Vec = std::vector<double>;

Vec random_vec(std::size_t n, unsigned seed, double scale = 1.0) {
  std::mt19937 g(seed);
  std::normal_distribution<double> d(0, scale);
  Vec v(n);
  for (auto& x : v) x = d(g);
  return v;
}

double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Checks analytic d(loss)/dx against central differences on every element of x.
void expect_grad(const std::function<double(const Vec&)>& loss, Vec x, const Vec& analytic,
                 const char* what, double tol = 1e-6) {
  ASSERT_EQ(x.size(), analytic.size()) << what;
  const double h = 1e-5;
  double scale = 1e-3;
  for (double g : analytic) scale = std::max(scale, std::abs(g));
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double keep = x[i];
    x[i] = keep + h;
    const double up = loss(x);
    x[i] = keep - h;
    const double down = loss(x);
    x[i] = keep;
    const double fd = (up - down) / (2 * h);
    ASSERT_NEAR(analytic[i], fd, tol * scale) << what << " element " << i;
  }
}

TEST(Kernels, RmsNormGradientsMatchFiniteDifferences) {
  const std::int64_t rows = 5, h = 7;
  Vec x = random_vec(rows * h, 1), w = random_vec(h, 2), c = random_vec(rows * h, 3);
  auto loss = [&](const Vec& xx, const Vec& ww) {
    Vec y(xx.size()), rstd(rows);
    kernels::rmsnorm_forward(xx.data(), ww.data(), y.data(), rstd.data(), rows, h, 1e-6);
    return dot(y, c);
  };
  Vec y(x.size()), rstd(rows), dx(x.size()), dw(h, 0.5);
  kernels::rmsnorm_forward(x.data(), w.data(), y.data(), rstd.data(), rows, h, 1e-6);
  kernels::rmsnorm_dgrad(c.data(), x.data(), w.data(), rstd.data(), dx.data(), rows, h);
  kernels::rmsnorm_wgrad(c.data(), x.data(), rstd.data(), dw.data(), rows, h, true);
  for (auto& v : dw) v -= 0.5;  // accumulate adds into what was there
  expect_grad([&](const Vec& v) { return loss(v, w); }, x, dx, "rmsnorm dx");
  expect_grad([&](const Vec& v) { return loss(x, v); }, w, dw, "rmsnorm dw");
}

TEST(Kernels, AttentionWithRopeAndGqaGradientsMatchFiniteDifferences) {
  const kernels::AttentionShape s{2, 5, 4, 2, 4};
  Vec qkv = random_vec(std::size_t(s.rows() * s.qkv_width()), 4, 0.7);
  Vec c = random_vec(std::size_t(s.rows() * s.heads * s.head_dim), 5);
  auto forward = [&](const Vec& in) {
    Vec r = in, out(c.size()), lse(static_cast<std::size_t>(s.batch * s.heads * s.seq));
    kernels::rope_apply(r.data(), s, kernels::Rotary{}, false);
    kernels::attention_forward(r.data(), out.data(), lse.data(), s);
    return std::make_tuple(r, out, lse);
  };
  auto loss = [&](const Vec& in) { return dot(std::get<1>(forward(in)), c); };
  auto [rot, out, lse] = forward(qkv);
  Vec d(qkv.size());
  kernels::attention_backward(c.data(), rot.data(), out.data(), lse.data(), d.data(), s);
  kernels::rope_apply(d.data(), s, kernels::Rotary{}, true);
  expect_grad(loss, qkv, d, "attention dqkv");
}

// MLA's shape: value heads narrower than query/key heads, RoPE on the last pe columns only
// (interleaved pairs, YaRN frequencies and magnitude), and its own softmax scale.
TEST(Kernels, MlaAttentionGradientsMatchFiniteDifferences) {
  kernels::AttentionShape s{2, 5, 3, 3, 6};
  s.v_head_dim = 4;
  s.rope_dim = 4;
  s.softmax_scale = 0.3;
  kernels::Rotary r;
  r.yarn = r.interleaved = true;
  r.scaling_factor = 40;
  r.mscale = 1.2;  // != mscale_all_dim: cos and sin are scaled, and backward must follow
  r.mscale_all_dim = 0.5;
  r.original_max_position_embeddings = 16;
  Vec qkv = random_vec(std::size_t(s.rows() * s.qkv_width()), 7, 0.7);
  Vec c = random_vec(std::size_t(s.rows() * s.out_width()), 8);
  auto forward = [&](const Vec& in) {
    Vec x = in, out(c.size()), lse(static_cast<std::size_t>(s.batch * s.heads * s.seq));
    kernels::rope_apply(x.data(), s, r, false);
    kernels::attention_forward(x.data(), out.data(), lse.data(), s);
    return std::make_tuple(x, out, lse);
  };
  auto loss = [&](const Vec& in) { return dot(std::get<1>(forward(in)), c); };
  auto [rot, out, lse] = forward(qkv);
  Vec d(qkv.size());
  kernels::attention_backward(c.data(), rot.data(), out.data(), lse.data(), d.data(), s);
  kernels::rope_apply(d.data(), s, r, true);
  expect_grad(loss, qkv, d, "mla attention dqkv");
  // RoPE leaves each head's first head_dim - rope_dim columns alone.
  Vec moved = qkv;
  kernels::rope_apply(moved.data(), s, r, false);
  for (std::int64_t row = 0; row < s.rows(); ++row)
    for (std::int64_t h = 0; h < s.heads + s.kv_heads; ++h)
      for (std::int64_t j = 0; j < 2; ++j) {
        const std::size_t i = std::size_t(row * s.qkv_width() + h * 6 + j);
        EXPECT_EQ(moved[i], qkv[i]);
      }
}

// YaRN's inverse frequencies and scales for DeepSeek-V3's rope (64 rotated columns, factor 40,
// 4096 original positions, beta 32 / 1), against Megatron's formulas evaluated independently:
// dims below 10 keep their frequency, dims above 23 are divided by the factor, a linear ramp
// between; mscale(40, 1) = 0.1 ln 40 + 1.
TEST(Kernels, YarnFrequenciesFollowMegatronsFormula) {
  kernels::Rotary r;
  r.yarn = true;
  r.scaling_factor = 40;
  r.mscale = r.mscale_all_dim = 1;
  const std::vector<double> f = r.inverse_frequencies(64);
  ASSERT_EQ(f.size(), 32u);
  EXPECT_DOUBLE_EQ(f[0], 1.0);
  EXPECT_NEAR(f[10], 0.05623413251903491, 1e-15);
  EXPECT_NEAR(f[20], 0.0007905694150420946, 1e-17);
  EXPECT_NEAR(f[31], 3.3338035804083097e-06, 1e-20);
  EXPECT_DOUBLE_EQ(r.cos_sin_scale(), 1.0);
  EXPECT_NEAR(r.softmax_mscale(), 1.3688879454113936, 1e-14);
  r.yarn = false;
  EXPECT_DOUBLE_EQ(r.inverse_frequencies(64)[31], std::pow(10000.0, -62.0 / 64));
  EXPECT_DOUBLE_EQ(r.softmax_mscale(), 1.0);
}

TEST(Kernels, AttentionIsCausal) {
  // The output at position i must not change when a later position's keys or values change.
  const kernels::AttentionShape s{1, 6, 2, 1, 4};
  Vec qkv = random_vec(std::size_t(s.rows() * s.qkv_width()), 6);
  Vec out1(std::size_t(s.rows() * 8)), out2(out1.size()), lse(12);
  kernels::attention_forward(qkv.data(), out1.data(), lse.data(), s);
  for (std::int64_t j = 2 * 4; j < s.qkv_width(); ++j)
    qkv[std::size_t(5 * s.qkv_width() + j)] += 1.0;
  kernels::attention_forward(qkv.data(), out2.data(), lse.data(), s);
  for (std::size_t i = 0; i < 5 * 8; ++i) EXPECT_EQ(out1[i], out2[i]) << i;
  EXPECT_NE(out1[5 * 8], out2[5 * 8]);
}

TEST(Kernels, SwigluWithProbsGradientsMatchFiniteDifferences) {
  const std::int64_t rows = 4, f = 3;
  Vec h = random_vec(rows * 2 * f, 7), p = random_vec(rows, 8), c = random_vec(rows * f, 9);
  auto loss = [&](const Vec& hh, const Vec& pp) {
    Vec a(static_cast<std::size_t>(rows * f));
    kernels::swiglu_forward(hh.data(), pp.data(), a.data(), rows, f);
    return dot(a, c);
  };
  Vec dh(h.size()), dp(p.size());
  kernels::swiglu_backward(c.data(), h.data(), p.data(), dh.data(), dp.data(), rows, f);
  expect_grad([&](const Vec& v) { return loss(v, p); }, h, dh, "swiglu dh");
  expect_grad([&](const Vec& v) { return loss(h, v); }, p, dp, "swiglu dprobs");
}

TEST(Kernels, GroupedLinearGradientsMatchFiniteDifferences) {
  const std::vector<std::int64_t> rows{3, 0, 2};  // an expert with no tokens too
  const std::int64_t in = 4, out = 5, n = 5;
  Vec x = random_vec(std::size_t(n * in), 10), w = random_vec(std::size_t(3 * out * in), 11),
      c = random_vec(std::size_t(n * out), 12);
  auto loss = [&](const Vec& xx, const Vec& ww) {
    Vec y(static_cast<std::size_t>(n * out));
    grouped_linear_forward(xx.data(), ww.data(), y.data(), rows, in, out);
    return dot(y, c);
  };
  Vec dx(x.size()), dw(w.size(), 0.0);
  grouped_linear_dgrad(c.data(), w.data(), dx.data(), rows, in, out);
  grouped_linear_wgrad(c.data(), x.data(), dw.data(), rows, in, out, false);
  expect_grad([&](const Vec& v) { return loss(v, w); }, x, dx, "linear dx");
  expect_grad([&](const Vec& v) { return loss(x, v); }, w, dw, "linear dw");
}

TEST(Kernels, CrossEntropyAndEmbeddingGradientsMatchFiniteDifferences) {
  const std::int64_t T = 4, V = 6, H = 3;
  const std::vector<std::int32_t> targets{1, 5, 0, 1}, ids{2, 0, 2, 5};
  Vec logits = random_vec(std::size_t(T * V), 13);
  auto loss = [&](const Vec& l) {
    Vec per(static_cast<std::size_t>(T));
    kernels::cross_entropy_forward(l.data(), targets.data(), per.data(), T, V);
    double s = 0;
    for (double v : per) s += v;
    return 0.25 * s;
  };
  Vec d(logits.size());
  kernels::cross_entropy_backward(logits.data(), targets.data(), d.data(), T, V, 0.25);
  expect_grad(loss, logits, d, "cross-entropy dlogits");

  Vec table = random_vec(std::size_t(V * H), 14), c = random_vec(std::size_t(T * H), 15);
  auto eloss = [&](const Vec& tb) {
    Vec y(static_cast<std::size_t>(T * H));
    kernels::embedding_forward(ids.data(), tb.data(), y.data(), T, H);
    return dot(y, c);
  };
  Vec dt(table.size(), 0.0);
  kernels::embedding_wgrad(ids.data(), c.data(), dt.data(), T, H);
  expect_grad(eloss, table, dt, "embedding dtable");
}

// The router's probabilities and losses are differentiable in the logits wherever the top-k
// choice does not change; the logits here are spread far enough that a 1e-5 step never flips it.
void check_router(RouterConfig cfg, const char* what) {
  const std::int64_t T = 6, seq = 3, E = cfg.num_experts;
  Vec logits = random_vec(std::size_t(T * E), 16, 2.0);
  Vec c = random_vec(std::size_t(T * cfg.topk), 17);
  const double scale = 0.7;
  auto loss = [&](const Vec& l) {
    auto r = route<double>(cfg, l.data(), T, seq, nullptr);
    return dot(r.probs, c) + scale * (r.aux_loss + r.seq_aux_loss + r.z_loss);
  };
  auto r = route<double>(cfg, logits.data(), T, seq, nullptr);
  Vec d(logits.size());
  route_backward<double>(cfg, logits.data(), r, c.data(), scale, d.data());
  expect_grad(loss, logits, d, what);
}

TEST(Kernels, RouterGradientsMatchFiniteDifferences) {
  RouterConfig base{.num_experts = 8, .topk = 2};
  base.aux_loss_coeff = 0.3;
  base.z_loss_coeff = 0.2;
  check_router(base, "softmax top-k, aux + z loss");
  RouterConfig pre = base;
  pre.pre_softmax = true;
  pre.load_balancing = LoadBalancing::SeqAuxLoss;
  check_router(pre, "pre-softmax, seq-aux loss");
  RouterConfig sig = base;
  sig.score = ScoreFunction::Sigmoid;
  sig.num_groups = 4;
  sig.group_topk = 2;
  sig.topk = 4;
  sig.topk_scaling_factor = 2.5;
  check_router(sig, "sigmoid, group-limited, scaled");
}

}  // namespace
}  // namespace nodeemu::layers
