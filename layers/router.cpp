#include "layers/router.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "devices/check.hpp"
#include "layers/kernels/logsumexp.hpp"

namespace nodeemu::layers {

namespace {

template <class T>
T sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

template <class T>
void softmax(const T* x, std::int64_t n, T* out) {
  T m = x[0];
  for (std::int64_t i = 1; i < n; ++i) m = std::max(m, x[i]);
  T s = 0;
  for (std::int64_t i = 0; i < n; ++i) s += (out[i] = std::exp(x[i] - m));
  for (std::int64_t i = 0; i < n; ++i) out[i] /= s;
}

// out += J^T g for out = softmax(x): dx = y * (g - sum(y * g)).
template <class T>
void softmax_backward(const T* y, const T* g, std::int64_t n, T* dx) {
  T dot = 0;
  for (std::int64_t i = 0; i < n; ++i) dot += y[i] * g[i];
  for (std::int64_t i = 0; i < n; ++i) dx[i] += y[i] * (g[i] - dot);
}

// The indices of the k largest values among the allowed ones, largest first, ties to the lower
// index (a stable order, so every run picks the same experts). One pass keeping the best k in
// order: a later index enters only by beating a kept value outright, which is exactly the order
// a stable sort of the whole list by value gives its first k. Meta mode routes every drawn token
// of a group-limited router through here (9 calls a token for DeepSeek-V3), and the full stable
// sort it replaces was half of a DeepSeek-V3-like meta step (perf).
template <class T>
std::vector<std::int64_t> topk_of(const std::vector<T>& v, const std::vector<char>& allowed,
                                  int k) {
  std::vector<std::int64_t> ids;
  ids.reserve(static_cast<std::size_t>(k) + 1);
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (!allowed[i]) continue;
    const T x = v[i];
    if (int(ids.size()) == k) {
      if (!(x > v[size_t(ids.back())])) continue;
      ids.pop_back();
    }
    auto pos = ids.end();
    while (pos != ids.begin() && x > v[size_t(*(pos - 1))]) --pos;
    ids.insert(pos, std::int64_t(i));
  }
  NE_CHECK(int(ids.size()) == k, "router: top-k of fewer allowed experts than k");
  return ids;
}

// The scores the load-balancing losses read: softmax over all experts, or the sigmoid scores
// normalised to sum to one (Megatron's scores_for_aux_loss).
template <class T>
void aux_scores(const RouterConfig& cfg, const T* l, T* s) {
  const std::int64_t E = cfg.num_experts;
  if (cfg.score == ScoreFunction::Softmax) {
    softmax(l, E, s);
    return;
  }
  T sum = 0;
  for (std::int64_t e = 0; e < E; ++e) sum += (s[e] = sigmoid(l[e]));
  for (std::int64_t e = 0; e < E; ++e) s[e] /= sum + T(1e-20);
}

template <class T>
void aux_scores_backward(const RouterConfig& cfg, const T* l, const T* ds, T* dl) {
  const std::int64_t E = cfg.num_experts;
  std::vector<T> s(std::size_t(E), T(0));
  if (cfg.score == ScoreFunction::Softmax) {
    softmax(l, E, s.data());
    softmax_backward(s.data(), ds, E, dl);
    return;
  }
  T sum = 0, dot = 0;
  for (std::int64_t e = 0; e < E; ++e) sum += (s[size_t(e)] = sigmoid(l[e]));
  sum += T(1e-20);
  for (std::int64_t e = 0; e < E; ++e) dot += ds[e] * s[size_t(e)];
  for (std::int64_t e = 0; e < E; ++e) {
    const T dsig = ds[e] / sum - dot / (sum * sum);
    dl[e] += dsig * s[size_t(e)] * (T(1) - s[size_t(e)]);
  }
}

// Per-token probabilities of the chosen experts, before the scaling factor.
template <class T>
void chosen_probs(const RouterConfig& cfg, const T* l, const std::int64_t* chosen, T* p) {
  const int k = cfg.topk;
  const std::int64_t E = cfg.num_experts;
  if (cfg.score == ScoreFunction::Softmax && cfg.pre_softmax) {
    std::vector<T> s(static_cast<std::size_t>(E));
    softmax(l, E, s.data());
    for (int j = 0; j < k; ++j) p[j] = s[size_t(chosen[j])];
  } else if (cfg.score == ScoreFunction::Softmax) {
    std::vector<T> sel(static_cast<std::size_t>(k));
    for (int j = 0; j < k; ++j) sel[size_t(j)] = l[chosen[j]];
    softmax(sel.data(), k, p);
  } else {
    T sum = 0;
    for (int j = 0; j < k; ++j) sum += (p[j] = sigmoid(l[chosen[j]]));
    if (k > 1)
      for (int j = 0; j < k; ++j) p[j] /= sum + T(1e-20);
  }
}

// Tokens per load-balancing span: all of them (aux_loss) or one sequence (seq_aux_loss).
std::int64_t span_length(const RouterConfig& cfg, TokenSpan span) {
  return cfg.load_balancing == LoadBalancing::SeqAuxLoss ? span.seq : span.total;
}

}  // namespace

template <class T>
Routing<T> route_choice(const RouterConfig& cfg, const T* logits, std::int64_t tokens,
                        const T* expert_bias) {
  const int k = cfg.topk;
  const std::int64_t E = cfg.num_experts;
  Routing<T> r;
  r.tokens = tokens;
  r.topk = k;
  r.chosen.resize(static_cast<std::size_t>(tokens * k));
  r.probs.resize(static_cast<std::size_t>(tokens * k));
  std::vector<T> v(static_cast<std::size_t>(E));
  for (std::int64_t t = 0; t < tokens; ++t) {
    const T* l = logits + t * E;
    std::int64_t* chosen = r.chosen.data() + t * k;
    if (cfg.force_load_balancing) {
      for (int j = 0; j < k; ++j) chosen[j] = (t * k + j) % E;
    } else {
      // Selection scores: logits, softmax scores or sigmoid scores, plus the expert bias.
      if (cfg.score == ScoreFunction::Softmax && !cfg.pre_softmax)
        std::copy(l, l + E, v.begin());
      else if (cfg.score == ScoreFunction::Softmax)
        softmax(l, E, v.data());
      else
        for (std::int64_t e = 0; e < E; ++e) v[size_t(e)] = sigmoid(l[e]);
      if (expert_bias)
        for (std::int64_t e = 0; e < E; ++e) v[size_t(e)] += expert_bias[e];
      std::vector<char> allowed(std::size_t(E), 1);
      if (cfg.num_groups > 0) {
        // Group limit: a group scores the sum of its best topk/group_topk experts; only the
        // best group_topk groups stay eligible.
        const std::int64_t per = E / cfg.num_groups;
        std::vector<T> gscore(static_cast<std::size_t>(cfg.num_groups));
        std::vector<char> all_in(std::size_t(per), 1);
        for (int g = 0; g < cfg.num_groups; ++g) {
          std::vector<T> sub(v.begin() + g * per, v.begin() + (g + 1) * per);
          T sum = 0;
          for (auto i : topk_of(sub, all_in, k / cfg.group_topk)) sum += sub[size_t(i)];
          gscore[size_t(g)] = sum;
        }
        std::vector<char> gall(std::size_t(cfg.num_groups), 1);
        std::fill(allowed.begin(), allowed.end(), 0);
        for (auto g : topk_of(gscore, gall, cfg.group_topk))
          std::fill(allowed.begin() + g * per, allowed.begin() + (g + 1) * per, 1);
      }
      const auto ids = topk_of(v, allowed, k);
      std::copy(ids.begin(), ids.end(), chosen);
    }
    T* p = r.probs.data() + t * k;
    chosen_probs(cfg, l, chosen, p);
    for (int j = 0; j < k; ++j) p[j] *= T(cfg.topk_scaling_factor);
  }
  r.idx = r.chosen;

  // Capacity: an expert keeps at most `cap` of its (token, choice) pairs, by probability or by
  // position; a dropped choice is removed from the routing and its probability zeroed.
  if (cfg.capacity_factor) {
    const std::int64_t cap = cfg.capacity(long(tokens));
    std::vector<std::vector<std::int64_t>> per(
        static_cast<std::size_t>(E));  // flat (t * k + j), token order
    for (std::int64_t i = 0; i < tokens * k; ++i) per[size_t(r.chosen[size_t(i)])].push_back(i);
    for (auto& list : per) {
      if (std::int64_t(list.size()) <= cap) continue;
      if (cfg.drop_policy == DropPolicy::Probs)
        std::stable_sort(list.begin(), list.end(), [&](std::int64_t a, std::int64_t b) {
          return r.probs[size_t(a)] > r.probs[size_t(b)];
        });
      for (std::size_t i = std::size_t(cap); i < list.size(); ++i) {
        r.idx[size_t(list[i])] = -1;
        r.probs[size_t(list[i])] = 0;
      }
    }
  }
  r.tokens_per_expert.assign(std::size_t(E), 0);
  for (auto e : r.idx)
    if (e >= 0) ++r.tokens_per_expert[size_t(e)];
  return r;
}

template <class T>
std::vector<std::int64_t> balance_counts(const RouterConfig& cfg, const Routing<T>& r,
                                         TokenSpan span) {
  const std::int64_t E = cfg.num_experts, first = span.first, len = span_length(cfg, span);
  std::vector<std::int64_t> c(std::size_t(span.total / len * E), 0);
  for (std::int64_t t = 0; t < r.tokens; ++t)
    for (int j = 0; j < r.topk; ++j)
      ++c[size_t((first + t) / len * E + r.chosen[size_t(t * r.topk + j)])];
  return c;
}

template <class T>
void add_balance_losses(const RouterConfig& cfg, const T* logits, Routing<T>& r, TokenSpan span,
                        std::vector<std::int64_t> counts) {
  const std::int64_t E = cfg.num_experts, k = cfg.topk, first = span.first;
  NE_CHECK(first >= 0 && first + r.tokens <= span.total, "router: tokens outside their span");
  r.span = span;
  r.balance_counts = std::move(counts);
  // Load-balancing losses, on the choice before any capacity drop, with every count and
  // normalisation over all the span's tokens: a rank's share of the loss covers its own tokens'
  // scores, so the shares add up to the loss of the whole.
  const T kE = T(E) / T(k);
  if (cfg.aux_loss_coeff > 0 && cfg.load_balancing != LoadBalancing::None) {
    const std::int64_t len = span_length(cfg, span), spans = span.total / len;
    std::vector<T> s(static_cast<std::size_t>(E));
    T total = 0;
    for (std::int64_t b = first / len; b <= (first + r.tokens - 1) / len && r.tokens > 0; ++b) {
      const std::int64_t* c = r.balance_counts.data() + b * E;
      std::vector<T> ssum(std::size_t(E), T(0));
      for (std::int64_t t = std::max(b * len, first); t < std::min((b + 1) * len, first + r.tokens);
           ++t) {
        aux_scores(cfg, logits + (t - first) * E, s.data());
        for (std::int64_t e = 0; e < E; ++e) ssum[size_t(e)] += s[size_t(e)];
      }
      T dot = 0;
      for (std::int64_t e = 0; e < E; ++e) dot += ssum[size_t(e)] * T(c[e]);
      total += dot * kE / (T(len) * T(len));
    }
    const T loss = total / T(spans) * T(cfg.aux_loss_coeff);
    (cfg.load_balancing == LoadBalancing::AuxLoss ? r.aux_loss : r.seq_aux_loss) = loss;
  }
  if (cfg.z_loss_coeff > 0) {
    T z = 0;
    for (std::int64_t t = 0; t < r.tokens; ++t) {
      const T lse = kernels::logsumexp(logits + t * E, E);
      z += lse * lse;
    }
    r.z_loss = z / T(span.total) * T(cfg.z_loss_coeff);
  }
}

template <class T>
Routing<T> route(const RouterConfig& cfg, const T* logits, std::int64_t tokens, std::int64_t seq,
                 const T* expert_bias) {
  NE_CHECK(seq > 0 && tokens % seq == 0, "router: tokens must be whole sequences");
  Routing<T> r = route_choice(cfg, logits, tokens, expert_bias);
  const TokenSpan all{0, tokens, seq};
  add_balance_losses(cfg, logits, r, all, balance_counts(cfg, r, all));
  return r;
}

template <class T>
void route_backward(const RouterConfig& cfg, const T* logits, const Routing<T>& r, const T* dprobs,
                    double loss_scale, T* dlogits) {
  const int k = cfg.topk;
  const std::int64_t E = cfg.num_experts, tokens = r.tokens;
  std::fill(dlogits, dlogits + tokens * E, T(0));
  std::vector<T> g(static_cast<std::size_t>(k)), p(static_cast<std::size_t>(k)),
      s(static_cast<std::size_t>(E)), ds(static_cast<std::size_t>(E));
  for (std::int64_t t = 0; t < tokens; ++t) {
    const T* l = logits + t * E;
    T* dl = dlogits + t * E;
    const std::int64_t* chosen = r.chosen.data() + t * k;
    for (int j = 0; j < k; ++j)
      g[size_t(j)] =
          r.idx[size_t(t * k + j)] < 0 ? T(0) : dprobs[t * k + j] * T(cfg.topk_scaling_factor);
    if (cfg.score == ScoreFunction::Softmax && cfg.pre_softmax) {
      softmax(l, E, s.data());
      std::fill(ds.begin(), ds.end(), T(0));
      for (int j = 0; j < k; ++j) ds[size_t(chosen[j])] += g[size_t(j)];
      softmax_backward(s.data(), ds.data(), E, dl);
    } else if (cfg.score == ScoreFunction::Softmax) {
      chosen_probs(cfg, l, chosen, p.data());
      std::vector<T> dsel(std::size_t(k), T(0));
      softmax_backward(p.data(), g.data(), k, dsel.data());
      for (int j = 0; j < k; ++j) dl[chosen[j]] += dsel[size_t(j)];
    } else {
      T sum = 0, dot = 0;
      for (int j = 0; j < k; ++j) sum += (p[size_t(j)] = sigmoid(l[chosen[j]]));
      sum += T(1e-20);
      for (int j = 0; j < k; ++j) dot += g[size_t(j)] * p[size_t(j)];
      for (int j = 0; j < k; ++j) {
        const T dsig = k > 1 ? g[size_t(j)] / sum - dot / (sum * sum) : g[size_t(j)];
        dl[chosen[j]] += dsig * p[size_t(j)] * (T(1) - p[size_t(j)]);
      }
    }
  }
  const T kE = T(E) / T(k);
  const TokenSpan span = r.span;
  if (cfg.aux_loss_coeff > 0 && cfg.load_balancing != LoadBalancing::None) {
    const std::int64_t len = span_length(cfg, span), spans = span.total / len;
    const T scale = T(loss_scale * cfg.aux_loss_coeff) * kE / (T(len) * T(len) * T(spans));
    for (std::int64_t t = 0; t < tokens; ++t) {
      const std::int64_t* c = r.balance_counts.data() + (span.first + t) / len * E;
      for (std::int64_t e = 0; e < E; ++e) ds[size_t(e)] = scale * T(c[e]);
      aux_scores_backward(cfg, logits + t * E, ds.data(), dlogits + t * E);
    }
  }
  if (cfg.z_loss_coeff > 0) {
    for (std::int64_t t = 0; t < tokens; ++t) {
      const T* l = logits + t * E;
      const T lse = kernels::logsumexp(l, E);
      const T c = T(loss_scale * cfg.z_loss_coeff) * T(2) * lse / T(span.total);
      softmax(l, E, s.data());
      for (std::int64_t e = 0; e < E; ++e) dlogits[t * E + e] += c * s[size_t(e)];
    }
  }
}

void update_expert_bias(float* bias, const std::vector<std::int64_t>& tokens_per_expert,
                        double rate) {
  if (tokens_per_expert.empty()) return;
  const double mean =
      double(std::accumulate(tokens_per_expert.begin(), tokens_per_expert.end(), std::int64_t(0))) /
      double(tokens_per_expert.size());
  for (std::size_t e = 0; e < tokens_per_expert.size(); ++e) {
    const double diff = mean - double(tokens_per_expert[e]);
    bias[e] += float(rate * (diff > 0 ? 1 : diff < 0 ? -1 : 0));
  }
}

#define NE_INSTANTIATE(T)                                                                      \
  template Routing<T> route_choice<T>(const RouterConfig&, const T*, std::int64_t, const T*);  \
  template std::vector<std::int64_t> balance_counts<T>(const RouterConfig&, const Routing<T>&, \
                                                       TokenSpan);                             \
  template void add_balance_losses<T>(const RouterConfig&, const T*, Routing<T>&, TokenSpan,   \
                                      std::vector<std::int64_t>);
NE_INSTANTIATE(float)
NE_INSTANTIATE(double)
#undef NE_INSTANTIATE
template Routing<float> route<float>(const RouterConfig&, const float*, std::int64_t, std::int64_t,
                                     const float*);
template Routing<double> route<double>(const RouterConfig&, const double*, std::int64_t,
                                       std::int64_t, const double*);
template void route_backward<float>(const RouterConfig&, const float*, const Routing<float>&,
                                    const float*, double, float*);
template void route_backward<double>(const RouterConfig&, const double*, const Routing<double>&,
                                     const double*, double, double*);

}  // namespace nodeemu::layers
