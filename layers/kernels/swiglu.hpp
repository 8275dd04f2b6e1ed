// SwiGLU with the router's probabilities applied in the activation, as Megatron's grouped MLP
// does (the probs multiply the activation, not the expert input): for h = [gate | up] of width
// 2f, a = silu(gate) * up * p. Without probs (shared experts, dense MLP) p = 1.
#pragma once
#include <cstdint>

namespace nodeemu::layers::kernels {

// h: [rows][2f]; probs: [rows] or null; a: [rows][f].
template <class T>
void swiglu_forward(const T* h, const T* probs, T* a, std::int64_t rows, std::int64_t f);
// dh: [rows][2f]; dprobs: [rows] (written when probs is not null).
template <class T>
void swiglu_backward(const T* da, const T* h, const T* probs, T* dh, T* dprobs, std::int64_t rows,
                     std::int64_t f);

}  // namespace nodeemu::layers::kernels
