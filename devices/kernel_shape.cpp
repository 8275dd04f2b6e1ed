#include "devices/kernel_shape.hpp"

namespace nodeemu {

double KernelShape::attention_flops() const {
  const double s = static_cast<double>(seq), kv = kv_seq > 0 ? static_cast<double>(kv_seq) : s;
  const double pairs = causal ? s * kv - 0.5 * s * s : s * kv;
  const double f = 2.0 * static_cast<double>(batch) * q_heads * pairs * (d_qk + d_v);
  return backward ? 2.5 * f : f;
}

const char* gemm_layout_name(GemmLayout l) {
  switch (l) {
    case GemmLayout::NT:
      return "NT";
    case GemmLayout::NN:
      return "NN";
    case GemmLayout::TN:
      return "TN";
  }
  return "?";
}

const char* attention_backend_name(AttentionBackend b) {
  return b == AttentionBackend::Cudnn ? "cudnn" : "flash";
}

const char* memory_op_name(MemoryOp op) {
  switch (op) {
    case MemoryOp::Copy:
      return "copy";
    case MemoryOp::Elementwise:
      return "elementwise";
    case MemoryOp::Norm:
      return "norm";
    case MemoryOp::Gather:
      return "gather";
    case MemoryOp::Scatter:
      return "scatter";
    case MemoryOp::Activation:
      return "activation";
    case MemoryOp::Router:
      return "router";
    case MemoryOp::ScatterAdd:
      return "scatter_add";
    case MemoryOp::Strided:
      return "strided";
  }
  return "?";
}

std::string describe(const KernelShape& s) {
  auto n = [](std::int64_t v) { return std::to_string(v); };
  switch (s.kind) {
    case KernelKind::Unspecified:
      return "unspecified";
    case KernelKind::Gemm:
      return std::string("gemm ") + gemm_layout_name(s.layout) + " " + n(s.m) + "x" + n(s.n) + "x" +
             n(s.k);
    case KernelKind::GroupedGemm:
      return std::string("grouped gemm ") + gemm_layout_name(s.layout) + " " + n(s.groups) +
             " groups, " + n(s.m) + " rows, weight " + n(s.n) + "x" + n(s.k);
    case KernelKind::Attention:
      return std::string("attention ") + (s.backward ? "bwd " : "fwd ") +
             attention_backend_name(s.backend) + " b" + n(s.batch) + " s" + n(s.seq) +
             (s.kv_seq > 0 ? " kv" + n(s.kv_seq) : "") + " h" + n(s.q_heads) + "/" + n(s.kv_heads) +
             " d" + n(s.d_qk) + "/" + n(s.d_v) + (s.causal ? " causal" : "");
    case KernelKind::MemoryBound:
      return std::string("memory-bound ") + memory_op_name(s.op);
  }
  return "?";
}

}  // namespace nodeemu
