#include "layers/context_parallel.hpp"

#include <cstring>
#include <vector>

#include "devices/check.hpp"
#include "devices/device.hpp"
#include "devices/errors.hpp"
#include "layers/detail/op_launch.hpp"

namespace nodeemu::layers {

using namespace ops::detail;
using kernels::AttentionShape;

namespace {

// The key and value blocks of every CP rank, owner order: block o holds rank o's
// [batch][seq][kv_width] keys and values (its two chunks of each sequence, in its order).
struct KvBlocks {
  std::vector<Tensor> tensors;  // what keeps them alive: one gathered tensor, or one per block
  std::vector<View> views;      // one per owner
  std::vector<Event> arrived;   // p2p: block o is there once arrived[o] has completed
};

int mod(int a, int n) {
  return ((a % n) + n) % n;
}

// This rank's key and value columns of qkv: [rows][kv_width] (the last columns of each row).
void pack_kv(ops::At at, const Tensor& qkv, const AttentionShape& s, const View& dst,
             const Tensor& dst_tensor) {
  const std::int64_t e = std::int64_t(dtype_bytes(qkv.dtype())), w = s.qkv_width(),
                     kw = s.kv_width(), rows = s.rows();
  const View src = view(qkv);
  launch(
      at.stream, at.named("cp_kv_pack"),
      memory(MemoryOp::Copy, 0, 2.0 * double(rows * kw * e), qkv.dtype()),
      [=] {
        for (std::int64_t r = 0; r < rows; ++r)
          std::memcpy(static_cast<char*>(dst.data) + r * kw * e,
                      static_cast<const char*>(src.data) + (r * w + w - kw) * e,
                      std::size_t(kw * e));
      },
      {qkv, dst_tensor}, at.tally);
}

// One step of a ring over the CP group: `send` to the next rank, `recv` from the previous one,
// as one grouped send and receive (TE's batch_isend_irecv), on the ring's stream.
Event ring_step(const ContextParallel& cp, const Tensor& send, const Tensor& recv,
                const std::string& name) {
  std::vector<std::size_t> send_bytes(std::size_t(cp.size), 0), recv_bytes(send_bytes);
  send_bytes[std::size_t(mod(cp.rank + 1, cp.size))] = send.bytes();
  recv_bytes[std::size_t(mod(cp.rank - 1, cp.size))] = recv.bytes();
  Group g = cp.group;  // a handle: the collectives are not const
  Stream ring = cp.ring;
  g.all_to_all_v(send.buffer(), send_bytes, recv.buffer(), recv_bytes, ring,
                 {.async = true, .name = name});
  Event done;
  ring.record(done);
  return done;
}

// Every rank's keys and values: all-gathered on the compute stream, or passed along the ring.
KvBlocks exchange_kv(ops::At at, const ContextParallel& cp, const Tensor& qkv,
                     const AttentionShape& s, const char* pass) {
  const std::int64_t rows = s.rows(), kw = s.kv_width();
  KvBlocks kv;
  const std::string tag = std::string("cp_kv_") + pass;
  if (cp.comm == CpCommType::AllGather) {
    Tensor local = at.empty({rows, kw}, qkv.dtype());
    pack_kv(at, qkv, s, view(local), local);
    Tensor all = at.empty({cp.size * rows, kw}, qkv.dtype());
    Group g = cp.group;
    g.all_gather(local.buffer(), all.buffer(), local.bytes(), at.stream,
                 {.async = true, .name = at.named(tag + "_allgather")});
    kv.tensors = {all};
    for (int o = 0; o < cp.size; ++o) kv.views.push_back(rows_view(view(all), o * rows, rows, kw));
    return kv;
  }
  kv.arrived.resize(std::size_t(cp.size));
  for (int o = 0; o < cp.size; ++o) {
    kv.tensors.push_back(at.empty({rows, kw}, qkv.dtype()));
    kv.views.push_back(view(kv.tensors.back()));
  }
  pack_kv(at, qkv, s, kv.views[std::size_t(cp.rank)], kv.tensors[std::size_t(cp.rank)]);
  Event packed;
  at.stream.record(packed);
  Stream ring = cp.ring;
  ring.wait(packed);
  // Step i brings rank (rank - i)'s block, and forwards the one step i - 1 brought.
  for (int i = 1; i < cp.size; ++i)
    kv.arrived[std::size_t(mod(cp.rank - i, cp.size))] =
        ring_step(cp, kv.tensors[std::size_t(mod(cp.rank - i + 1, cp.size))],
                  kv.tensors[std::size_t(mod(cp.rank - i, cp.size))],
                  at.named(tag + "_ring" + std::to_string(i)));
  return kv;
}

// The kernels one pass launches: their shapes (priced from the attention table by their FLOPs)
// and the causal pairs each computes. all_gather: one per local chunk against the keys up to its
// end. p2p: step 0 is the local chunks against themselves (a causal kernel of seq rows); step i
// the block of rank o = rank - i, all of it unmasked: both local chunks against o's first chunk
// when o is earlier, or the second local chunk against both of o's when it is later.
struct CpKernel {
  std::int64_t seq, kv_seq;
  bool causal;
  double pairs;
  int owner;  // p2p: the block it waits for (-1: none)
};

std::vector<CpKernel> cp_kernels(const ContextParallel& cp, const AttentionShape& s) {
  const std::int64_t C = s.chunk();
  const double c = double(C);
  std::vector<CpKernel> k;
  if (cp.comm == CpCommType::AllGather) {
    for (std::int64_t h = 0; h < 2; ++h) {
      const std::int64_t lk = (s.chunk_index(h) + 1) * C;
      k.push_back({C, lk, true, c * double(lk - C) + c * (c + 1) / 2, -1});
    }
    return k;
  }
  k.push_back({2 * C, 0, true, 3 * c * c / 2 + c, -1});
  for (int i = 1; i < cp.size; ++i) {
    const int o = mod(cp.rank - i, cp.size);
    if (o < cp.rank)
      k.push_back({2 * C, C, false, 2 * c * c, o});
    else
      k.push_back({C, 2 * C, false, 2 * c * c, o});
  }
  return k;
}

KernelShape cp_shape(CoreAttention backend, const AttentionShape& s, const CpKernel& k, bool bwd) {
  KernelShape shape = KernelShape::attention(
      backend == CoreAttention::Flash ? AttentionBackend::Flash : AttentionBackend::Cudnn, bwd,
      k.causal, s.batch, k.seq, int(s.heads), int(s.kv_heads), int(s.head_dim), int(s.dv()));
  shape.kv_seq = k.kv_seq;
  return shape;
}

// Launches a pass's kernels on the compute stream; the last runs `body`, the values of all.
void launch_steps(ops::At at, const ContextParallel& cp, const AttentionShape& s,
                  const KvBlocks& kv, bool backward, const char* name, std::function<void()> body,
                  std::vector<Tensor> uses) {
  NE_CHECK(at.k().attention != CoreAttention::Unfused,
           "context parallelism needs a fused attention backend (validate refuses unfused)");
  const std::vector<CpKernel> ks = cp_kernels(cp, s);
  const double per_pair =
      2.0 * double(s.batch * s.heads) * double(s.head_dim + s.dv()) * (backward ? 2.5 : 1.0);
  for (std::size_t i = 0; i < ks.size(); ++i) {
    if (ks[i].owner >= 0) at.stream.wait(kv.arrived[std::size_t(ks[i].owner)]);
    const bool last = i + 1 == ks.size();
    launch(at.stream, at.named(std::string(name) + ".cp" + std::to_string(i)),
           work(cp_shape(at.k().attention, s, ks[i], backward), ks[i].pairs * per_pair,
                double(s.rows() * s.qkv_width()) * double(dtype_bytes(uses.front().dtype())),
                uses.front().dtype()),
           last ? std::move(body) : std::function<void()>(), last ? uses : std::vector<Tensor>{},
           at.tally);
  }
}

// Every owner's block in position order: [batch][full_seq][kv_width] (fp32).
std::vector<float> to_positions(F32Scope& f, const std::vector<View>& blocks,
                                const AttentionShape& s) {
  const std::int64_t kw = s.kv_width(), C = s.chunk(), S = s.full_seq();
  std::vector<float> kv(std::size_t(s.batch * S * kw));
  for (std::size_t o = 0; o < blocks.size(); ++o) {
    AttentionShape owner = s;
    owner.cp_rank = std::int64_t(o);
    const float* b = f.in(blocks[o]);
    for (std::int64_t bi = 0; bi < s.batch; ++bi)
      for (std::int64_t h = 0; h < 2; ++h)
        std::copy_n(b + (bi * s.seq + h * C) * kw, C * kw,
                    kv.data() + (bi * S + owner.chunk_index(h) * C) * kw);
  }
  return kv;
}

// The inverse: position-order gradients into each owner's block.
void from_positions(F32Scope& f, const std::vector<float>& kv, const std::vector<View>& blocks,
                    const AttentionShape& s) {
  const std::int64_t kw = s.kv_width(), C = s.chunk(), S = s.full_seq();
  for (std::size_t o = 0; o < blocks.size(); ++o) {
    AttentionShape owner = s;
    owner.cp_rank = std::int64_t(o);
    float* b = f.out(blocks[o]);
    for (std::int64_t bi = 0; bi < s.batch; ++bi)
      for (std::int64_t h = 0; h < 2; ++h)
        std::copy_n(kv.data() + (bi * S + owner.chunk_index(h) * C) * kw, C * kw,
                    b + (bi * s.seq + h * C) * kw);
  }
}

Reduction sum_of(DType t) {
  NE_CHECK(t == DType::F32 || t == DType::BF16, "context-parallel gradients of fp16");
  return t == DType::BF16 ? Reduction::SumBF16 : Reduction::SumF32;
}

}  // namespace

ContextParallel ContextParallel::of(Group group, Group tp_cp, int rank, CpCommType comm,
                                    Device& device) {
  ContextParallel cp;
  cp.rank = group.index_of(rank);
  if (cp.rank < 0 || tp_cp.index_of(rank) < 0)
    throw UsageError("context parallel group '" + group.name() + "' or '" + tp_cp.name() +
                     "' does not hold rank " + std::to_string(rank));
  cp.size = group.size();
  cp.group = std::move(group);
  cp.tp_cp = std::move(tp_cp);
  cp.comm = comm;
  if (comm == CpCommType::P2P) cp.ring = device.create_stream(Priority::Normal, "cp_ring");
  return cp;
}

void cp_attention_forward(ops::At at, const ContextParallel& cp, const Tensor& qkv,
                          const AttentionShape& s, Tensor& out, Tensor& lse) {
  NE_CHECK(cp.on() && s.cp == cp.size && s.cp_rank == cp.rank && s.seq % 2 == 0,
           "context-parallel attention on a shape that is not this rank's");
  out = at.empty({s.rows(), s.out_width()}, qkv.dtype());
  lse = at.empty({s.batch, s.heads, s.seq}, DType::F32);
  const KvBlocks kv = exchange_kv(at, cp, qkv, s, "fwd");
  const View vq = view(qkv), vo = view(out), vl = view(lse);
  const std::vector<View> blocks = kv.views;
  std::vector<Tensor> uses{qkv, out, lse};
  uses.insert(uses.end(), kv.tensors.begin(), kv.tensors.end());
  launch_steps(
      at, cp, s, kv, false, "core_attention",
      [=] {
        F32Scope f;
        const std::vector<float> all = to_positions(f, blocks, s);
        kernels::attention_forward_cp(f.in(vq), all.data(), f.out(vo), vl.as<float>(), s);
      },
      uses);
}

Tensor cp_attention_backward(ops::At at, const ContextParallel& cp, const Tensor& dout,
                             const Tensor& qkv, const Tensor& out, const Tensor& lse,
                             const AttentionShape& s) {
  const std::int64_t rows = s.rows(), kw = s.kv_width(), w = s.qkv_width();
  const DType t = dout.dtype();
  Tensor dqkv = at.empty(qkv.shape(), t);
  // The keys and values again (TE saves only this rank's), then this rank's share of every
  // block's gradients: one tensor to reduce-scatter, or one per owner for the ring.
  const KvBlocks kv = exchange_kv(at, cp, qkv, s, "bwd");
  std::vector<Tensor> parts;
  std::vector<View> part_views;
  if (cp.comm == CpCommType::AllGather) {
    parts.push_back(at.empty({cp.size * rows, kw}, t));
    for (int o = 0; o < cp.size; ++o)
      part_views.push_back(rows_view(view(parts.front()), o * rows, rows, kw));
  } else {
    for (int o = 0; o < cp.size; ++o) {
      parts.push_back(at.empty({rows, kw}, t));
      part_views.push_back(view(parts.back()));
    }
  }
  const View vd = view(dout), vq = view(qkv), vo = view(out), vl = view(lse), vdq = view(dqkv);
  const std::vector<View> blocks = kv.views;
  std::vector<Tensor> uses{dqkv, dout, qkv, out, lse};
  uses.insert(uses.end(), kv.tensors.begin(), kv.tensors.end());
  uses.insert(uses.end(), parts.begin(), parts.end());
  launch_steps(
      at, cp, s, kv, true, "core_attention_bwd",
      [=] {
        F32Scope f;
        const std::vector<float> all = to_positions(f, blocks, s);
        std::vector<float> dkv(all.size());
        kernels::attention_backward_cp(f.in(vd), f.in(vq), all.data(), f.in(vo),
                                       vl.as<const float>(), f.inout(vdq), dkv.data(), s);
        from_positions(f, dkv, part_views, s);
      },
      uses);

  // Each owner's key and value gradients, summed over the CP group.
  Tensor mine;
  if (cp.comm == CpCommType::AllGather) {
    mine = at.empty({rows, kw}, t);
    Group g = cp.group;
    g.reduce_scatter(parts.front().buffer(), mine.buffer(),
                     std::vector<std::size_t>(std::size_t(cp.size), std::size_t(rows * kw)),
                     at.stream, {.async = true, .name = at.named("cp_dkv_reducescatter")},
                     sum_of(t));
  } else {
    // A ring: the partial sum for owner o starts at rank o + 1 and gathers each rank's share on
    // its way to o; step i sends the one for owner rank - i and receives the one for
    // rank - i - 1, to which this rank adds its own.
    Event ready;
    at.stream.record(ready);
    Stream ring = cp.ring;
    Tensor acc = parts[std::size_t(mod(cp.rank - 1, cp.size))];
    for (int i = 1; i < cp.size; ++i) {
      ring.wait(ready);
      Tensor received = at.empty({rows, kw}, t);
      at.stream.wait(ring_step(cp, acc, received, at.named("cp_dkv_ring" + std::to_string(i))));
      const Tensor& own = parts[std::size_t(mod(cp.rank - i - 1, cp.size))];
      Tensor sum = at.empty({rows, kw}, t);
      const View va = view(received), vb = view(own), vs = view(sum);
      const std::int64_t n = rows * kw;
      launch(
          at.stream, at.named("cp_dkv_add"),
          memory(MemoryOp::Elementwise, double(n), 3.0 * double(sum.bytes()), t),
          [=] {
            F32Scope f;
            const float *a = f.in(va), *b = f.in(vb);
            float* o = f.out(vs);
            for (std::int64_t j = 0; j < n; ++j) o[j] = a[j] + b[j];
          },
          {received, own, sum}, at.tally);
      at.stream.record(ready);
      acc = sum;
    }
    mine = acc;
  }
  // Into the key and value columns of dqkv.
  const View vm = view(mine);
  const std::int64_t e = std::int64_t(dtype_bytes(t));
  launch(
      at.stream, at.named("cp_dkv_unpack"),
      memory(MemoryOp::Copy, 0, 2.0 * double(mine.bytes()), t),
      [=] {
        for (std::int64_t r = 0; r < rows; ++r)
          std::memcpy(static_cast<char*>(vdq.data) + (r * w + w - kw) * e,
                      static_cast<const char*>(vm.data) + r * kw * e, std::size_t(kw * e));
      },
      {mine, dqkv}, at.tally);
  return dqkv;
}

}  // namespace nodeemu::layers
