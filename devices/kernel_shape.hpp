// What a kernel is, in the terms of a GPU profile's measured tables (configs/gpus/*/): the
// timing plane prices a kernel by looking its shape up in the table of its kind, so a kernel
// that states its shape is priced from measurements, and one that does not falls back to a
// roofline and is reported as unpriced (GpuProfile::price).
#pragma once

#include <cstdint>
#include <string>

namespace nodeemu {

enum class KernelKind : std::uint8_t {
  Unspecified,  // no table: priced by the roofline fallback (flops, bytes) and reported
  Gemm,         // one GEMM: gemm_bf16.csv (bf16/fp16) or gemm_other.csv (fp32)
  GroupedGemm,  // one grouped GEMM over local experts: grouped_gemm_bf16.csv
  Attention,    // fused causal attention, forward or backward: attention_bf16.csv
  MemoryBound,  // a kernel bound by HBM traffic (Work::bytes): memory_bound.csv
};

// For every layout C[m,n] is the output and k the reduction (the calibration tables' columns):
//   NT  C = A[m,k] * B[n,k]^T   a linear layer's forward: m tokens, n out, k in features
//   NN  C = A[m,k] * B[k,n]     its dgrad:                m tokens, n in,  k out features
//   TN  C = A[k,m]^T * B[k,n]   its wgrad:                m out,    n in,  k tokens
enum class GemmLayout : std::uint8_t { NT, NN, TN };

enum class AttentionBackend : std::uint8_t {
  Cudnn,  // Transformer Engine's FusedAttention (cuDNN): what "auto" picks on Hopper
  Flash,  // FlashAttention
};

// The memory-bound kernel classes; the profile's YAML says which measured series prices each.
enum class MemoryOp : std::uint8_t {
  Copy,         // a plain device-to-device copy (bytes read + written)
  Elementwise,  // add, mul, cast, memset, optimizer steps: streaming elementwise work
  Norm,         // RMSNorm forward and backward
  Gather,       // row gathers: token permute, embedding lookup, sort by expert
  Scatter,      // row scatters with accumulation: unpermute, embedding wgrad
  Activation,   // SwiGLU forward and backward
  Router,       // router softmax + top-k (Work::bytes are the fp32 logits)
  // The unfused paths' kernels that run far below the bytes-over-bandwidth rate
  // (shared/calibration/h100_layer_anatomy): a profile without a series of their own prices
  // them as the class named after each.
  ScatterAdd,  // index_add / scatter_add of rows with atomics (a row gather's backward,
               // moe_utils.unpermute without fusion): as scatter
  Strided,     // elementwise ops on strided or broadcast operands (RoPE written out on the
               // heads' views, SwiGLU's halves, rotate-half's cat): as elementwise
};

inline constexpr MemoryOp kMemoryOps[] = {
    MemoryOp::Copy,   MemoryOp::Elementwise, MemoryOp::Norm,
    MemoryOp::Gather, MemoryOp::Scatter,     MemoryOp::Activation,
    MemoryOp::Router, MemoryOp::ScatterAdd,  MemoryOp::Strided};

struct KernelShape {
  KernelKind kind = KernelKind::Unspecified;
  // Gemm and GroupedGemm.
  GemmLayout layout = GemmLayout::NT;
  std::int64_t m = 0, n = 0, k = 0;  // Gemm: as above. GroupedGemm: m = rows over all groups,
                                     // n = out and k = in features of the forward's weight
  std::int64_t groups = 0;           // GroupedGemm
  // Attention: batch x heads x seq, per pass.
  AttentionBackend backend = AttentionBackend::Cudnn;
  bool backward = false;
  bool causal = true;
  std::int64_t batch = 0, seq = 0;
  // Keys per query row when they differ from seq (context parallelism's blocks: a chunk of
  // queries against the keys before it); 0: seq. A causal block is bottom-right aligned.
  std::int64_t kv_seq = 0;
  int q_heads = 0, kv_heads = 0, d_qk = 0, d_v = 0;
  // MemoryBound: which class; the bytes moved are Work::bytes.
  MemoryOp op = MemoryOp::Elementwise;

  static KernelShape gemm(GemmLayout l, std::int64_t m, std::int64_t n, std::int64_t k) {
    KernelShape s;
    s.kind = KernelKind::Gemm;
    s.layout = l;
    s.m = m, s.n = n, s.k = k;
    return s;
  }
  static KernelShape grouped_gemm(GemmLayout l, std::int64_t groups, std::int64_t rows,
                                  std::int64_t out_features, std::int64_t in_features) {
    KernelShape s;
    s.kind = KernelKind::GroupedGemm;
    s.layout = l;
    s.groups = groups;
    s.m = rows, s.n = out_features, s.k = in_features;
    return s;
  }
  static KernelShape attention(AttentionBackend b, bool backward, bool causal, std::int64_t batch,
                               std::int64_t seq, int q_heads, int kv_heads, int d_qk, int d_v) {
    KernelShape s;
    s.kind = KernelKind::Attention;
    s.backend = b;
    s.backward = backward;
    s.causal = causal;
    s.batch = batch, s.seq = seq;
    s.q_heads = q_heads, s.kv_heads = kv_heads, s.d_qk = d_qk, s.d_v = d_v;
    return s;
  }
  static KernelShape memory(MemoryOp op) {
    KernelShape s;
    s.kind = KernelKind::MemoryBound;
    s.op = op;
    return s;
  }
  // The attention FLOPs the calibration tables count: 2 b h s^2 (d_qk + d_v), halved when
  // causal; the backward does 2.5x the forward's (five matrix products against two). With
  // kv_seq: 2 b h s kv (d_qk + d_v), less the masked s^2 / 2 pairs when causal.
  double attention_flops() const;
};

const char* gemm_layout_name(GemmLayout l);
const char* attention_backend_name(AttentionBackend b);
const char* memory_op_name(MemoryOp op);
// One line, for reports and --explain: "gemm NT 4096x2048x2048".
std::string describe(const KernelShape& s);

}  // namespace nodeemu
