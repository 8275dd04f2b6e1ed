// Multi-latent attention's data movement between its projections and the attention kernel
// (layers/ops.hpp): Megatron-Core's MLASelfAttention.get_query_key_value_tensors splits the
// down projection's output, views the up projections' outputs per head, and concatenates
// [no-pe | pe] parts into query and key (torch.cat, one copy kernel each) with the rope key part
// expanded to every head. The backward of that concatenation splits the gradients again and sums
// the rope key's over the heads.
#include "layers/detail/op_launch.hpp"
#include "layers/ops.hpp"

#include <algorithm>
#include <numeric>

#include "devices/check.hpp"
#include "layers/kernels/partition.hpp"

namespace nodeemu::layers::ops {

using namespace detail;

std::vector<Tensor> split_columns(At at, const std::string& name, const Tensor& x,
                                  const std::vector<std::int64_t>& widths) {
  const std::int64_t rows = rows_of(x), w = cols_of(x);
  NE_CHECK(std::accumulate(widths.begin(), widths.end(), std::int64_t{0}) == w,
           "split_columns: the widths do not add up to the tensor's");
  std::vector<Tensor> parts;
  std::vector<View> views;
  for (auto n : widths) {
    parts.push_back(at.empty({rows, n}, x.dtype()));
    views.push_back(view(parts.back()));
  }
  std::vector<Tensor> uses = parts;
  uses.push_back(x);
  const View vx = view(x);
  launch(
      at.stream, at.named(name), memory(MemoryOp::Copy, 0, 2 * double(x.bytes()), x.dtype()),
      [=] {
        F32Scope f;
        const float* in = f.in(vx);
        std::vector<float*> out;
        for (const View& v : views) out.push_back(f.out(v));
        kernels::for_row_blocks(rows, [&](std::int64_t r) {
          std::int64_t at_col = 0;
          for (std::size_t p = 0; p < widths.size(); ++p) {
            std::copy(in + r * w + at_col, in + r * w + at_col + widths[p], out[p] + r * widths[p]);
            at_col += widths[p];
          }
        });
      },
      std::move(uses), at.tally);
  return parts;
}

Tensor concat_columns(At at, const std::string& name, const std::vector<Tensor>& parts) {
  NE_CHECK(!parts.empty(), "concat_columns: nothing to concatenate");
  const std::int64_t rows = rows_of(parts[0]);
  std::vector<std::int64_t> widths;
  std::vector<View> views;
  for (const Tensor& p : parts) {
    NE_CHECK(rows_of(p) == rows, "concat_columns: the parts' rows differ");
    widths.push_back(cols_of(p));
    views.push_back(view(p));
  }
  const std::int64_t w = std::accumulate(widths.begin(), widths.end(), std::int64_t{0});
  Tensor out = at.empty({rows, w}, parts[0].dtype());
  std::vector<Tensor> uses = parts;
  uses.push_back(out);
  const View vo = view(out);
  launch(
      at.stream, at.named(name), memory(MemoryOp::Copy, 0, 2 * double(out.bytes()), out.dtype()),
      [=] {
        F32Scope f;
        std::vector<const float*> in;
        for (const View& v : views) in.push_back(f.in(v));
        float* o = f.out(vo);
        kernels::for_row_blocks(rows, [&](std::int64_t r) {
          std::int64_t at_col = 0;
          for (std::size_t p = 0; p < widths.size(); ++p) {
            std::copy(in[p] + r * widths[p], in[p] + (r + 1) * widths[p], o + r * w + at_col);
            at_col += widths[p];
          }
        });
      },
      std::move(uses), at.tally);
  return out;
}

// q: [rows][heads][d] (no-pe | pe per head, as the attention kernel's query heads already are);
// kv: [rows][heads][qk | dv]; k_pe: [rows][pe]. Megatron's two torch.cat (query, key) and the
// value's contiguous copy are priced as one copy of the assembled tensor.
Tensor mla_qkv(At at, const Tensor& q, const Tensor& kv, const Tensor& k_pe,
               const kernels::AttentionShape& s) {
  const std::int64_t rows = s.rows(), h = s.heads, d = s.head_dim, dv = s.dv();
  const std::int64_t pe = s.rotated(), qk = d - pe, w = s.qkv_width();
  NE_CHECK(s.kv_heads == h, "mla_qkv: MLA has one key/value head per query head");
  Tensor qkv = at.empty({rows, w}, q.dtype());
  const View vq = view(q), vkv = view(kv), vpe = view(k_pe), vo = view(qkv);
  launch(
      at.stream, at.named("mla_qkv_concat"),
      memory(MemoryOp::Copy, 0, 2 * double(qkv.bytes()), q.dtype()),
      [=] {
        F32Scope f;
        const float *iq = f.in(vq), *ikv = f.in(vkv), *ipe = f.in(vpe);
        float* o = f.out(vo);
        kernels::for_row_blocks(rows, [&](std::int64_t r) {
          float* row = o + r * w;
          std::copy(iq + r * h * d, iq + (r + 1) * h * d, row);
          for (std::int64_t j = 0; j < h; ++j) {
            const float* src = ikv + (r * h + j) * (qk + dv);
            float* k = row + (h + j) * d;
            std::copy(src, src + qk, k);
            std::copy(ipe + r * pe, ipe + (r + 1) * pe, k + qk);
            std::copy(src + qk, src + qk + dv, row + 2 * h * d + j * dv);
          }
        });
      },
      {q, kv, k_pe, qkv}, at.tally);
  return qkv;
}

void mla_qkv_backward(At at, const Tensor& dqkv, const kernels::AttentionShape& s, Tensor& dq,
                      Tensor& dkv, Tensor& dk_pe) {
  const std::int64_t rows = s.rows(), h = s.heads, d = s.head_dim, dv = s.dv();
  const std::int64_t pe = s.rotated(), qk = d - pe, w = s.qkv_width();
  dq = at.empty({rows, h * d}, dqkv.dtype());
  dkv = at.empty({rows, h * (qk + dv)}, dqkv.dtype());
  dk_pe = at.empty({rows, pe}, dqkv.dtype());
  const View vg = view(dqkv), vq = view(dq), vkv = view(dkv), vpe = view(dk_pe);
  launch(
      at.stream, at.named("mla_qkv_concat_bwd"),
      memory(MemoryOp::Elementwise, double(rows * h * pe), 2 * double(dqkv.bytes()), dqkv.dtype()),
      [=] {
        F32Scope f;
        const float* g = f.in(vg);
        float *oq = f.out(vq), *okv = f.out(vkv), *ope = f.out(vpe);
        kernels::for_row_blocks(rows, [&](std::int64_t r) {
          const float* row = g + r * w;
          std::copy(row, row + h * d, oq + r * h * d);
          float* kpe = ope + r * pe;
          std::fill(kpe, kpe + pe, 0.0f);
          // The expanded rope key's gradient: the heads' sum, in head order.
          for (std::int64_t j = 0; j < h; ++j) {
            const float* k = row + (h + j) * d;
            float* dst = okv + (r * h + j) * (qk + dv);
            std::copy(k, k + qk, dst);
            for (std::int64_t c = 0; c < pe; ++c) kpe[c] += k[qk + c];
            const float* v = row + 2 * h * d + j * dv;
            std::copy(v, v + dv, dst + qk);
          }
        });
      },
      {dqkv, dq, dkv, dk_pe}, at.tally);
}

}  // namespace nodeemu::layers::ops
