#include "layers/token_permute.hpp"

#include <algorithm>
#include <cstring>

#include "devices/check.hpp"
#include "layers/kernels/partition.hpp"

namespace nodeemu::layers {

namespace {
Work move_work(MemoryOp op, double bytes) {
  return Work{.bytes = bytes, .shape = KernelShape::memory(op)};
}
std::int64_t width_of(const Tensor& t) {
  return t.shape().size() < 2 ? 1 : t.numel() / std::max<std::int64_t>(1, t.dim(0));
}

// A sort's kernel body: places the pair in slot `sl` (token sl / topk's row and probability) at
// row `place` of the output.
struct Placer {
  const char* x;
  const float* p;
  char* rows;
  float* probs;
  std::int32_t* slots;
  std::int64_t row_bytes;
  int topk;
  Placer(const View& vx, const View& vp, const Sorted& s, int k)
      : x(static_cast<const char*>(vx.data)),
        p(vp.as<const float>()),
        rows(static_cast<char*>(view(s.rows).data)),
        probs(view(s.probs).as<float>()),
        slots(view(s.slots).as<std::int32_t>()),
        row_bytes(s.rows.shape().back() * std::int64_t(dtype_bytes(s.rows.dtype()))),
        topk(k) {}
  void put(std::int64_t place, std::int64_t sl) const {
    std::memcpy(rows + place * row_bytes, x + (sl / topk) * row_bytes, std::size_t(row_bytes));
    probs[place] = p[sl];
    slots[place] = std::int32_t(sl);
  }
};
}  // namespace

Sorted sort_by_expert(ops::At at, const std::string& name, const Tensor& x, const Tensor& idx,
                      const Tensor& probs, int topk, std::int64_t first, std::int64_t count,
                      std::int64_t pad, std::int64_t total) {
  const std::int64_t h = x.shape().back(), tokens = x.dim(0);
  Sorted s{at.empty({total, h}, x.dtype()), at.empty({total}, DType::F32),
           at.empty({total}, DType::I32)};
  const View vi = view(idx);
  const Placer put(view(x), view(probs), s, topk);
  if (!at.k().permute_fusion) {
    // moe_utils.permute without TE's fused kernel: the routing map transposed, a stable argsort
    // of it, the probabilities gathered, then the tokens' index_select (below).
    const double pairs = double(tokens) * double(count);
    launch(at.stream, name + ".routing_map", move_work(MemoryOp::Elementwise, 2 * pairs), nullptr,
           {}, at.tally);
    launch(at.stream, name + ".argsort", move_work(MemoryOp::Elementwise, 2 * pairs * 8), nullptr,
           {}, at.tally);
    launch(at.stream, name + ".probs", move_work(MemoryOp::Gather, 2 * double(total) * 4), nullptr,
           {}, at.tally);
  }
  launch(
      at.stream, name,
      move_work(MemoryOp::Gather, 2.0 * double(s.rows.bytes()) + double(idx.bytes())),
      [=] {
        const auto* ids = vi.as<const std::int64_t>();
        std::int64_t at_row = 0;
        for (std::int64_t e = first; e < first + count; ++e) {
          const std::int64_t start = at_row;
          for (std::int64_t sl = 0; sl < tokens * topk; ++sl) {
            if (ids[sl] != e) continue;
            NE_CHECK(at_row < total, "sort_by_expert: more rows than the host was told");
            put.put(at_row++, sl);
          }
          if (pad > 0) {
            NE_CHECK(at_row - start <= pad, "sort_by_expert: an expert over its capacity");
            for (; at_row < start + pad; ++at_row) put.slots[at_row] = -1;  // zero rows, prob 0
          }
        }
        NE_CHECK(at_row == total, "sort_by_expert: fewer rows than the host was told");
      },
      {x, idx, probs, s.rows, s.probs, s.slots}, at.tally);
  return s;
}

Sorted sort_within_budget(ops::At at, const std::string& name, const Tensor& x, const Tensor& idx,
                          const Tensor& probs, int topk, std::int64_t count, std::int64_t align,
                          std::int64_t budget, Tensor& rows, const Tensor& overflow) {
  NE_CHECK(align > 0 && budget % align == 0, "sort_within_budget: budget not a multiple of align");
  const std::int64_t h = x.shape().back(), tokens = x.dim(0);
  Sorted s{at.empty({budget, h}, x.dtype()), at.empty({budget}, DType::F32),
           at.empty({budget}, DType::I32)};
  rows = at.empty({count}, DType::I64);
  const View vi = view(idx), vn = view(rows), vo = view(overflow);
  const Placer put(view(x), view(probs), s, topk);
  auto padded = [align](std::int64_t n) { return (n + align - 1) / align * align; };
  launch(
      at.stream, name,
      move_work(MemoryOp::Gather, 2.0 * double(s.rows.bytes()) + double(idx.bytes())),
      [=] {
        const auto* ids = vi.as<const std::int64_t>();
        std::fill(put.slots, put.slots + budget, -1);  // the unused tail and the padding: no pair
        std::int64_t start = 0;  // expert e's first place: the previous experts' padded pairs
        bool dropped = false;
        for (std::int64_t e = 0; e < count; ++e) {
          std::int64_t pairs = 0, kept = 0;
          for (std::int64_t sl = 0; sl < tokens * topk; ++sl) {
            if (ids[sl] != e) continue;
            const std::int64_t place = start + pairs++;
            if (place >= budget) continue;
            put.put(place, sl);
            ++kept;
          }
          dropped |= kept < pairs;
          vn.as<std::int64_t>()[e] = padded(kept);
          start += padded(pairs);
        }
        if (dropped) vo.as<std::int32_t>()[0] = 1;
      },
      {x, idx, probs, s.rows, s.probs, s.slots, rows, overflow}, at.tally);
  return s;
}

namespace {
Tensor output(ops::At at, Shape shape, DType dtype, const Buffer& into) {
  if (!into) return at.empty(std::move(shape), dtype);
  return Tensor(into, std::move(shape), dtype);
}
}  // namespace

Tensor unpermute(ops::At at, const std::string& name, const Tensor& rows, const Tensor& probs,
                 const Tensor& slots, int topk, std::int64_t tokens, DType out_dtype,
                 const Buffer& into) {
  const std::int64_t h = rows.shape().back(), n = rows.dim(0);
  const bool with_probs = static_cast<bool>(probs);
  NE_CHECK(!with_probs || out_dtype == DType::F32, "unpermute: probabilities need an fp32 output");
  const std::int64_t w = h + (with_probs ? topk : 0);
  Tensor out = output(at, {tokens, w}, out_dtype, into);
  // Without TE's moe_unpermute: zeros, then scatter_add (moe_utils.unpermute), whose atomics run
  // far below the bandwidth (MemoryOp::ScatterAdd; the layer anatomy's index_add).
  const bool fused = at.k().permute_fusion;
  if (!fused)
    launch(at.stream, name + ".zeros", move_work(MemoryOp::Elementwise, double(out.bytes())),
           nullptr, {}, at.tally);
  View vr = view(rows), vp = with_probs ? view(probs) : View{}, vs = view(slots), vo = view(out);
  launch(
      at.stream, name,
      Work{.flops = double(n * h),
           .bytes = double(rows.bytes() + out.bytes()),
           .shape = KernelShape::memory(fused ? MemoryOp::Scatter : MemoryOp::ScatterAdd)},
      [=] {
        F32Scope f;
        const float* r = f.in(vr);
        const auto* sl = vs.as<const std::int32_t>();
        float* o = f.inout(vo);  // zeros, summed into in fp32, stored once in out's dtype
        // Columns in blocks, rows in order inside each: every token sums its rows in row
        // order whatever the thread count.
        kernels::for_column_blocks(h, [&](std::int64_t j0, std::int64_t j1) {
          for (std::int64_t i = 0; i < n; ++i) {
            if (sl[i] < 0) continue;
            float* dst = o + (sl[i] / topk) * w;
            for (std::int64_t j = j0; j < j1; ++j) dst[j] += r[i * h + j];
          }
        });
        if (with_probs)
          for (std::int64_t i = 0; i < n; ++i)
            if (sl[i] >= 0) o[(sl[i] / topk) * w + h + sl[i] % topk] = vp.as<const float>()[i];
      },
      {rows, probs, slots, out}, at.tally);
  return out;
}

Tensor scatter_probs(ops::At at, const std::string& name, const Tensor& probs, const Tensor& slots,
                     int topk, std::int64_t tokens, const Buffer& into) {
  Tensor out = output(at, {tokens, topk}, DType::F32, into);
  View vp = view(probs), vs = view(slots), vo = view(out);
  const std::int64_t n = slots.dim(0);
  launch(
      at.stream, name, move_work(MemoryOp::Scatter, double(probs.bytes() + out.bytes())),
      [=] {
        const auto* sl = vs.as<const std::int32_t>();
        const auto* p = vp.as<const float>();
        auto* o = vo.as<float>();
        for (std::int64_t i = 0; i < n; ++i)
          if (sl[i] >= 0) o[sl[i]] = p[i];  // slot = row * topk + choice
      },
      {probs, slots, out}, at.tally);
  return out;
}

Tensor gather_rows(ops::At at, const std::string& name, const Tensor& src, const Tensor& slots,
                   int topk) {
  const std::int64_t n = slots.dim(0), h = src.shape().back();
  Tensor out = at.empty({n, h}, src.dtype());
  View vs = view(src), vl = view(slots), vo = view(out);
  const std::size_t row_bytes = std::size_t(h) * dtype_bytes(src.dtype());
  launch(
      at.stream, name, move_work(MemoryOp::Gather, 2.0 * double(out.bytes())),
      [=] {
        const auto* sl = vl.as<const std::int32_t>();
        kernels::for_row_blocks(n, [&](std::int64_t i) {
          if (sl[i] < 0) return;  // padding stays zero
          std::memcpy(static_cast<char*>(vo.data) + i * std::int64_t(row_bytes),
                      static_cast<const char*>(vs.data) + (sl[i] / topk) * std::int64_t(row_bytes),
                      row_bytes);
        });
      },
      {src, slots, out}, at.tally);
  return out;
}

Tensor permute_blocks(ops::At at, const std::string& name, const Tensor& in,
                      const std::vector<RowBlock>& blocks) {
  Tensor out = at.empty(in.shape(), in.dtype());
  const std::size_t row_bytes = std::size_t(width_of(in)) * dtype_bytes(in.dtype());
  View vi = view(in), vo = view(out);
  launch(
      at.stream, name,
      move_work(at.k().permute_fusion ? MemoryOp::Gather : MemoryOp::Copy,
                2.0 * double(in.bytes())),
      [=] {
        for (const auto& b : blocks)
          if (b.n > 0)
            std::memcpy(static_cast<char*>(vo.data) + b.dst * std::int64_t(row_bytes),
                        static_cast<const char*>(vi.data) + b.src * std::int64_t(row_bytes),
                        std::size_t(b.n) * row_bytes);
      },
      {in, out}, at.tally);
  return out;
}

std::vector<RowBlock> inverse(const std::vector<RowBlock>& blocks) {
  std::vector<RowBlock> out;
  out.reserve(blocks.size());
  for (const auto& b : blocks) out.push_back({b.dst, b.src, b.n});
  return out;
}

void split_packed(ops::At at, const std::string& name, const Tensor& packed, std::int64_t h,
                  int topk, DType dtype, Tensor& hidden, Tensor& probs) {
  const std::int64_t tokens = packed.dim(0), w = h + topk;
  hidden = at.empty({tokens, h}, dtype);
  probs = at.empty({tokens, topk}, DType::F32);
  View vp = view(packed), vh = view(hidden), vq = view(probs);
  launch(
      at.stream, name, move_work(MemoryOp::Copy, 2.0 * double(packed.bytes())),
      [=] {
        F32Scope f;
        float* hd = f.out(vh);
        const float* p = vp.as<const float>();
        for (std::int64_t t = 0; t < tokens; ++t) {
          std::copy(p + t * w, p + t * w + h, hd + t * h);
          std::copy(p + t * w + h, p + (t + 1) * w, vq.as<float>() + t * topk);
        }
      },
      {packed, hidden, probs}, at.tally);
}

std::vector<std::int64_t> count_per_expert(const std::int64_t* idx, std::int64_t rows, int topk,
                                           std::int64_t first, std::int64_t count) {
  std::vector<std::int64_t> c(std::size_t(count), 0);
  for (std::int64_t i = 0; i < rows * topk; ++i)
    if (idx[i] >= first && idx[i] < first + count) ++c[std::size_t(idx[i] - first)];
  return c;
}

std::vector<std::int64_t> balanced_counts(std::int64_t tokens, int topk, std::int64_t experts) {
  std::vector<std::int64_t> c(std::size_t(experts), 0);
  const std::int64_t pairs = tokens * topk;
  for (std::int64_t e = 0; e < experts; ++e)
    c[std::size_t(e)] = pairs / experts + (e < pairs % experts);
  return c;
}

}  // namespace nodeemu::layers
