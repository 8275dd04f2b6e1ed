// The built-in schedules and the steps they are made of.
#include <algorithm>

#include "devices/check.hpp"
#include "devices/errors.hpp"
#include "emu/recipe_views.hpp"
#include "emu/schedule.hpp"

namespace nodeemu::emu {

using layers::ChunkPlan;
using layers::LayerPlan;
using layers::ScheduleNode;

namespace {

// A node's wgrad, when the context delays it (otherwise backward() already ran it).
void dw(ScheduleNode& n, bool delay) {
  if (delay) n.backward_dw();
}

}  // namespace

namespace {

// The forward of one plan, its input received first.
void forward_compute(StepContext& step, PlanId id) {
  step.recv_forward(id);
  step.plan(id).forward_all();
}

// The backward of one plan, its output gradient received first; node by node, as
// ChunkPlan::backward_all orders them, with each wgrad right after its dgrad.
void backward_compute(StepContext& step, PlanId id) {
  step.recv_backward(id);
  ChunkPlan& p = step.plan(id);
  const bool delay = step.exec().delay_wgrad;
  p.loss.backward();
  dw(p.loss, delay);
  for (auto it = p.layers.rbegin(); it != p.layers.rend(); ++it) {
    LayerPlan& l = **it;
    l.mtp.backward();
    l.combine.backward();
    l.mlp.backward();
    dw(l.mlp, delay);
    l.dispatch.backward();
    l.pre_dispatch.backward();
    dw(l.pre_dispatch, delay);
  }
  p.embedding.backward();
  dw(p.embedding, delay);
}

}  // namespace

void forward_step(StepContext& step, PlanId id) {
  forward_compute(step, id);
  step.send_forward(id);
}

void backward_step(StepContext& step, PlanId id) {
  backward_compute(step, id);
  step.send_backward(id);
  step.release(id);
}

void schedule_layer_pair(std::optional<LayerNodes> f, std::optional<LayerNodes> b, bool delay_wgrad,
                         const OverlapOptions& o, bool defer_b_attention_wgrad) {
  // REFERENCE section 1, "Issue order for a (forward f, backward b) layer pair".
  const bool early = o.early_attn_memory_release;
  if (b) b->mtp->backward();                     // 1
  if (b) b->combine->backward();                 // 2
  if (f) f->pre_dispatch->forward();             // 3
  if (b) b->mlp->backward();                     // 4
  if (f) f->dispatch->forward();                 // 5
  if (b) dw(*b->mlp, delay_wgrad);               // 6: the experts' wgrad (fc2, then fc1)
  if (b) b->dispatch->backward();                // 7
  if (b && early) b->pre_dispatch->backward();   // 10, moved before 8
  if (f) f->mlp->forward();                      // 8
  if (f) f->combine->forward();                  // 9
  if (b && !early) b->pre_dispatch->backward();  // 10
  if (f) f->mtp->forward();                      // 11
  if (b && !defer_b_attention_wgrad) dw(*b->pre_dispatch, delay_wgrad);  // 12
}

void combined_step(StepContext& step, std::optional<PlanId> fid, std::optional<PlanId> bid,
                   const OverlapOptions& o) {
  // Both inputs are in place before the step (posted a step ahead by the schedule).
  if (fid) step.recv_forward(*fid);
  if (bid) step.recv_backward(*bid);
  ChunkPlan* f = fid ? &step.plan(*fid) : nullptr;
  ChunkPlan* b = bid ? &step.plan(*bid) : nullptr;
  const bool delay = step.exec().delay_wgrad;
  // Chunk level (REFERENCE section 1): embedding forward with the loss backward...
  if (f) f->embedding.forward();
  if (b) {
    b->loss.backward();
    dw(b->loss, delay);
  }
  // ... forward layer i with backward layer L-1-i, then the leftover backward layers, then the
  // leftover forward layers ...
  const int nf = f ? int(f->layers.size()) : 0, nb = b ? int(b->layers.size()) : 0;
  const int pairs = std::min(nf, nb);
  // The first layer's attention wgrad waits until after the pipeline send of the backward.
  auto f_layer = [&](int i) { return LayerNodes::of(*f->layers[std::size_t(i)]); };
  auto b_layer = [&](int i) { return LayerNodes::of(*b->layers[std::size_t(nb - 1 - i)]); };
  for (int i = 0; i < pairs; ++i)
    schedule_layer_pair(f_layer(i), b_layer(i), delay, o, nb - 1 - i == 0);
  for (int i = pairs; i < nb; ++i)
    schedule_layer_pair(std::nullopt, b_layer(i), delay, o, nb - 1 - i == 0);
  for (int i = pairs; i < nf; ++i) schedule_layer_pair(f_layer(i), std::nullopt, delay, o);
  // ... then the loss forward and the embedding backward.
  if (f) f->loss.forward();
  if (b) {
    b->embedding.backward();
    dw(b->embedding, delay);
  }
  // post_forward on the comm stream, post_backward on the compute stream (combined_1f1b.py).
  if (fid) step.send_forward(*fid, layers::StreamKind::Comm);
  if (bid) {
    step.send_backward(*bid);
    if (nb > 0) dw(b->layers.front()->pre_dispatch, delay);
    step.release(*bid);
  }
}

std::vector<PlanId> schedule_table(int microbatches, int chunks, int group) {
  NE_CHECK(group >= 1 && chunks >= 1, "schedule_table: a group and chunks of at least 1");
  std::vector<PlanId> table;
  table.reserve(std::size_t(microbatches) * std::size_t(chunks));
  for (int first = 0; first < microbatches; first += group) {
    const int last = first + group >= microbatches ? microbatches : first + group;
    for (int c = 0; c < chunks; ++c)
      for (int mb = first; mb < last; ++mb) table.push_back({mb, c});
  }
  return table;
}

int megatron_warmup(int pp, int rank, int chunks, int microbatches, int group, bool ep_overlap) {
  const int total = microbatches * chunks;
  const int extra = ep_overlap ? 1 : 0;
  if (chunks == 1) return std::min(pp - rank - 1 + extra, total);
  return std::min(2 * (pp - rank - 1) + (chunks - 1) * group + extra, total);
}

void run_pipelined(StepContext& step, int warmup, bool combined, const OverlapOptions& o,
                   int group) {
  const int vpp = step.chunks();
  const std::vector<PlanId> table = schedule_table(step.microbatches(), vpp, group);
  const int total = int(table.size());
  warmup = std::clamp(warmup, 0, total);
  auto F = [&](int k) -> std::optional<PlanId> {
    if (k >= total) return std::nullopt;
    return table[std::size_t(k)];
  };
  auto B = [&](int k) -> std::optional<PlanId> {
    if (k >= total) return std::nullopt;
    return PlanId{table[std::size_t(k)].microbatch, vpp - 1 - table[std::size_t(k)].chunk};
  };
  auto call = [&](P2pCall c) { step.communicate(c); };
  const PipelineComm mode = step.pipeline_comm();

  if (combined) {
    // The combined 1F1B (EP overlap; PP = 1, or VPP with overlap_p2p_comm): each step's sends
    // are inside combined_step, where Megatron posts them; the next step's receives are posted
    // right after, a step ahead.
    for (int k = 0; k < warmup; ++k) {
      combined_step(step, F(k), std::nullopt, o);
      call({.recv_forward = F(k + 1), .recv_backward = k == warmup - 1 ? B(0) : std::nullopt});
    }
    for (int k = 0; k + warmup < total; ++k) {
      combined_step(step, F(k + warmup), B(k), o);
      call({.recv_forward = F(k + warmup + 1), .recv_backward = B(k + 1)});
    }
    for (int k = std::max(0, total - warmup); k < total; ++k) {
      combined_step(step, std::nullopt, B(k), o);
      call({.recv_backward = B(k + 1)});
    }
    return;
  }
  auto backward_and_send = [&](int k, P2pCall c) {
    backward_compute(step, *B(k));
    c.send_backward = B(k);
    call(c);
    step.release(*B(k));
  };
  if (vpp == 1 && !mode.overlap) {
    // forward_backward_pipelining_without_interleaving: blocking calls, the steady state's two
    // of them each a send and a receive in one (send_forward_recv_backward,
    // send_backward_recv_forward), so that neighbours never wait on each other's sends.
    for (int k = 0; k < warmup; ++k) {
      forward_compute(step, *F(k));
      call({.send_forward = F(k)});
    }
    if (warmup < total) call({.recv_forward = F(warmup)});
    for (int k = 0; k + warmup < total; ++k) {
      forward_compute(step, *F(k + warmup));
      call({.send_forward = F(k + warmup), .recv_backward = B(k)});
      backward_and_send(k, {.recv_forward = F(k + warmup + 1)});
    }
    for (int k = std::max(0, total - warmup); k < total; ++k) backward_and_send(k, {});
    return;
  }
  // forward_backward_pipelining_with_interleaving. Each forward's call sends its output and
  // receives the next forward's input, each backward's its gradient and the next backward's;
  // the last warm-up call also receives the first backward's. With overlap_p2p_comm the calls
  // return at once and each compute waits for its own input (a step after it was posted);
  // without, the steady state's forward and backward share one blocking call
  // (send_forward_backward_recv_forward_backward).
  for (int k = 0; k < warmup; ++k) {
    forward_compute(step, *F(k));
    call({.send_forward = F(k),
          .recv_forward = F(k + 1),
          .recv_backward = k == warmup - 1 ? B(0) : std::nullopt});
  }
  for (int k = 0; k + warmup < total; ++k) {
    forward_compute(step, *F(k + warmup));
    if (mode.overlap) {
      call({.send_forward = F(k + warmup), .recv_forward = F(k + warmup + 1)});
      backward_and_send(k, {.recv_backward = B(k + 1)});
    } else {
      backward_and_send(k, {.send_forward = F(k + warmup),
                            .recv_forward = F(k + warmup + 1),
                            .recv_backward = B(k + 1)});
    }
  }
  for (int k = std::max(0, total - warmup); k < total; ++k)
    backward_and_send(k, {.recv_backward = B(k + 1)});
}

namespace {

int warmup_of(const StepContext& step, int group, bool ep_overlap) {
  return megatron_warmup(step.pp_size(), step.pp_rank(), step.chunks(), step.microbatches(), group,
                         ep_overlap);
}

class Sequential : public Schedule {
 public:
  std::string name() const override { return "sequential"; }
  void run(StepContext& step) override { run_pipelined(step, 0, false, {}, 1); }
};

class OneFOneB : public Schedule {
 public:
  OneFOneB(bool interleaved, int group) : interleaved_(interleaved), group_(group) {}
  std::string name() const override { return interleaved_ ? "interleaved-1f1b" : "1f1b"; }
  void run(StepContext& step) override {
    run_pipelined(step, warmup_of(step, group_, false), false, {}, group_);
  }

 private:
  bool interleaved_;
  int group_;
};

class CombinedOverlap : public Schedule {
 public:
  CombinedOverlap(OverlapOptions o, int group) : o_(o), group_(group) {}
  std::string name() const override { return "combined-1f1b-a2a-overlap"; }
  void run(StepContext& step) override {
    // With PP = 1: the first forward alone, then (f i+1, b i) pairs.
    run_pipelined(step, warmup_of(step, group_, true), true, o_, group_);
  }

 private:
  OverlapOptions o_;
  int group_;
};

}  // namespace

std::unique_ptr<Schedule> make_schedule(const ScheduleChoice& c) {
  if (c.ep_overlap) return std::make_unique<CombinedOverlap>(c.overlap, c.group);
  if (c.pp == 1) return std::make_unique<Sequential>();
  return std::make_unique<OneFOneB>(c.vpp > 1, c.group);
}

}  // namespace nodeemu::emu
