#include "layers/model_chunk.hpp"

#include <cstring>

#include "devices/device.hpp"
#include "devices/errors.hpp"
#include "devices/host.hpp"
#include "devices/node.hpp"
#include "layers/kernels/rmsnorm.hpp"
#include "layers/kernels/vocab.hpp"

namespace nodeemu::layers {

MicroBatch synthetic_microbatch(const ModelConfig& cfg, std::int64_t batch, std::int64_t seq,
                                std::uint64_t seed, int dp_rank, int index) {
  MicroBatch mb;
  mb.batch = batch;
  mb.seq = seq;
  const std::uint64_t stream =
      name_hash("data") ^ (std::uint64_t(dp_rank) << 32) ^ std::uint64_t(index);
  // A token stream per sequence; the label of each position is the next token.
  for (std::int64_t b = 0; b < batch; ++b) {
    std::vector<std::int32_t> s(static_cast<std::size_t>(seq + 1));
    for (std::int64_t t = 0; t <= seq; ++t) {
      const double u = counter_normal(seed, stream, std::uint64_t(b * (seq + 1) + t));
      s[std::size_t(t)] =
          std::int32_t(std::uint64_t(std::abs(u) * 1e6) % std::uint64_t(cfg.vocab_size));
    }
    mb.tokens.insert(mb.tokens.end(), s.begin(), s.end() - 1);
    mb.labels.insert(mb.labels.end(), s.begin() + 1, s.end());
  }
  return mb;
}

MicroBatch shape_only_microbatch(std::int64_t batch, std::int64_t seq) {
  MicroBatch mb;
  mb.batch = batch;
  mb.seq = seq;
  mb.tokens.assign(static_cast<std::size_t>(batch * seq), 0);
  mb.labels = mb.tokens;
  return mb;
}

MicroBatch context_parallel_slice(const MicroBatch& mb, int size, int rank) {
  if (size == 1) return mb;
  if (mb.seq % (2 * size) != 0)
    throw UsageError("context parallelism: seq_length " + std::to_string(mb.seq) +
                     " does not split into 2 x context_parallel_size chunks");
  MicroBatch out;
  out.batch = mb.batch;
  out.seq = mb.seq / size;
  const std::int64_t chunk = mb.seq / (2 * size);
  for (std::int64_t b = 0; b < mb.batch; ++b)
    for (std::int64_t c : {std::int64_t(rank), std::int64_t(2 * size - 1 - rank)}) {
      const std::size_t from = std::size_t(b * mb.seq + c * chunk);
      out.tokens.insert(out.tokens.end(), mb.tokens.begin() + std::ptrdiff_t(from),
                        mb.tokens.begin() + std::ptrdiff_t(from + std::size_t(chunk)));
      out.labels.insert(out.labels.end(), mb.labels.begin() + std::ptrdiff_t(from),
                        mb.labels.begin() + std::ptrdiff_t(from + std::size_t(chunk)));
    }
  return out;
}

ModelChunk::ModelChunk(const ModelConfig& cfg, ChunkSpec spec, Device& device, std::uint64_t seed,
                       Group ep, int rank, TensorParallel tp, TensorParallel etp,
                       ContextParallel cp)
    : cfg_(cfg), spec_(spec), device_(device), tp_(std::move(tp)) {
  cfg.validate();
  if (spec.first_layer < 0 || spec.num_layers < 0 ||
      spec.first_layer + spec.num_layers > cfg.num_layers)
    throw ConfigError("model", "num_layers",
                      "chunk layers [" + std::to_string(spec.first_layer) + ", " +
                          std::to_string(spec.first_layer + spec.num_layers) + ") exceed " +
                          std::to_string(cfg.num_layers) + " layers");
  // The vocabulary's rows split over TP: this rank's shard starts at row rank * V / tp.
  const std::int64_t H = cfg.hidden_size, V = cfg.vocab_size / tp_.size;
  const std::int64_t first_row = tp_.rank * V * H;
  if (spec.pre_process)
    embedding_ = make_parameter(device, "embedding.word_embeddings.weight", {V, H}, cfg.dtype,
                                Init::Normal, cfg.init_method_std, seed, first_row);
  for (int l = spec.first_layer; l < spec.first_layer + spec.num_layers; ++l)
    layers_.push_back(
        std::make_unique<TransformerLayer>(cfg, l, device, seed, ep, rank, tp_, etp, cp));
  if (spec.post_process && cfg.mtp_num_layers > 0) {
    // MTP layer k is layer num_layers + k (its routing, hooks and names are its own).
    layers_.push_back(std::make_unique<TransformerLayer>(cfg, cfg.num_layers, device, seed, ep,
                                                         rank, tp_, etp, cp));
    mtp_ = std::make_unique<MtpWeights>(cfg, device, seed, tp_);
    if (!spec.pre_process)
      mtp_embedding_ = make_parameter(device, "embedding.word_embeddings.weight", {V, H}, cfg.dtype,
                                      Init::Normal, cfg.init_method_std, seed, first_row);
  }
  if (spec.post_process) {
    final_norm_ = make_parameter(device, "decoder.final_layernorm.weight", {H}, cfg.dtype,
                                 Init::Ones, 0, seed);
    final_norm_.sequence_parallel = tp_.on();
    // The output layer and the loss run in fp32 (fp32 logits, as Megatron's fused
    // cross-entropy upcasts them).
    output_ = make_parameter(device, "output_layer.weight", {V, H}, DType::F32, Init::Normal,
                             cfg.init_method_std, seed, first_row);
  }
}

ModelChunk::~ModelChunk() = default;

std::vector<Parameter*> ModelChunk::parameters() {
  std::vector<Parameter*> out;
  if (embedding_.value) out.push_back(&embedding_);
  for (auto& l : layers_)
    for (auto* p : l->parameters()) out.push_back(p);
  if (final_norm_.value) {
    out.push_back(&final_norm_);
    out.push_back(&output_);
  }
  if (mtp_)
    for (auto* p : mtp_->parameters()) out.push_back(p);
  if (mtp_embedding_.value) out.push_back(&mtp_embedding_);
  return out;
}

Parameter* ModelChunk::word_embedding() {
  if (embedding_.value) return &embedding_;
  return mtp_embedding_.value ? &mtp_embedding_ : nullptr;
}

void ModelChunk::zero_grad(Stream& s, WorkTally* tally) {
  std::vector<Tensor> zeroed;
  for (auto* p : parameters()) zeroed.push_back(p->main_grad);
  for (auto& l : layers_)
    if (l->local_tokens_per_expert()) zeroed.push_back(l->local_tokens_per_expert());
  for (const Tensor& t : zeroed) {
    View v = view(t);
    const std::size_t bytes = t.bytes();
    launch(
        s, "zero_grad",
        Work{.bytes = double(bytes), .shape = KernelShape::memory(MemoryOp::Elementwise)},
        [=] { std::memset(v.data, 0, bytes); }, {t}, tally);
  }
}

void ModelChunk::update_expert_bias(Group stage, Stream& s, WorkTally* tally) {
  for (auto& l : layers_) l->update_expert_bias(stage, s, tally);
}

std::unique_ptr<ChunkPlan> ModelChunk::plan(ExecContext& ctx, int microbatch,
                                            const MicroBatch& data, double loss_scale) {
  return std::make_unique<ChunkPlan>(*this, ctx, microbatch, data, loss_scale);
}

ChunkPlan::ChunkPlan(ModelChunk& chunk, ExecContext& ctx, int microbatch, const MicroBatch& data,
                     double loss_scale)
    : chunk_(chunk), ctx_(ctx), data_(data), loss_scale_(loss_scale) {
  const ModelConfig& c = chunk.cfg_;
  const std::int64_t T = data.batch * data.seq;
  if (std::int64_t(data.tokens.size()) != T || std::int64_t(data.labels.size()) != T)
    throw UsageError("micro-batch " + std::to_string(microbatch) + ": " +
                     std::to_string(data.tokens.size()) +
                     " tokens for batch x seq = " + std::to_string(T));
  Device& dev = chunk.device_;
  // Filled by fetch_batch, in the forward of the chunk's first node.
  tokens_ = Tensor::empty(dev, {T}, DType::I32);
  labels_ = Tensor::empty(dev, {T}, DType::I32);
  for (auto& l : chunk.layers_)
    layers.push_back(l->plan(ctx, &event, microbatch, data.batch, data.seq, loss_scale));
  // Each decoder layer reads the previous one's output, and its output gradient is the next
  // one's input gradient (or the loss's, or MTP's, or the next stage's).
  const std::size_t decoder = layers.size() - (chunk.mtp_ ? 1 : 0);
  for (std::size_t i = 0; i < decoder; ++i)
    layers[i]->connect(
        i == 0 ? (chunk.spec_.pre_process ? &embedded_ : &input) : &layers[i - 1]->output,
        i + 1 < decoder            ? &layers[i + 1]->grad_input
        : chunk.spec_.post_process ? &grad_hidden_
                                   : &grad_output);
  const Tensor* last =
      decoder == 0 ? (chunk.spec_.pre_process ? &embedded_ : &input) : &layers[decoder - 1]->output;
  if (chunk.mtp_)
    mtp_ = std::make_unique<MtpPlan>(
        c, *chunk.mtp_,
        MtpChunkParts{&chunk.final_norm_, chunk.word_embedding(), &chunk.output_, chunk.tp_},
        *layers.back(), ctx, &event, data, last, &grad_hidden_, loss_scale);
  if (chunk.spec_.pre_process) {
    embedding = ScheduleNode(
        "embedding", StreamKind::Compute, &ctx, &event,
        [this, &c](Stream& s) {
          fetch_batch(s);
          ops::At at{s, ctx_.tally, nullptr, &c.kernels};
          embedded_ = embedding_forward(at, chunk_.tp_, tokens_, chunk_.embedding_, c.dtype);
        },
        [this, &c, decoder](Stream& s) {
          ops::At at{s, ctx_.tally, nullptr, &c.kernels};
          g_embedded_ = embedding_grad_all(
              at, chunk_.tp_, decoder == 0 ? grad_hidden_ : layers.front()->grad_input);
        },
        [this, &c](Stream& s) {
          ops::At at{s, ctx_.tally, nullptr, &c.kernels};
          embedding_wgrad(at, chunk_.tp_, tokens_, g_embedded_, chunk_.embedding_);
          embedded_ = g_embedded_ = Tensor();
        });
  } else if (chunk.spec_.post_process || chunk.mtp_) {
    // A last stage's batch comes before its first layer, as forward_step calls get_batch first.
    embedding = ScheduleNode("get_batch", StreamKind::Compute, &ctx, &event,
                             [this](Stream& s) { fetch_batch(s); }, {});
  }
  if (chunk.spec_.post_process) {
    loss = ScheduleNode(
        "loss", StreamKind::Compute, &ctx, &event,
        [this, last, &c](Stream& s) {
          ops::At at{s, ctx_.tally, nullptr, &c.kernels};
          hidden_ = *last;
          // With MTP the final norm ran in the MTP layer's prologue, which reads its output too.
          if (mtp_)
            lnf_ = mtp_->final_norm_out();
          else
            ops::rmsnorm_forward(at, "final_layernorm", hidden_, chunk_.final_norm_,
                                 c.layernorm_epsilon, lnf_, rstd_);
          // The output layer is column-parallel over the vocabulary: all tokens' normed rows,
          // gathered again for its wgrad (only this rank's share is kept, as Megatron keeps it).
          const Tensor all =
              chunk_.tp_.on() ? gather_tokens(at, chunk_.tp_, lnf_, "sp_allgather_output") : lnf_;
          logits_ = ops::linear_forward(at, "output_layer", all, chunk_.output_.value,
                                        ops::one_group(all), DType::F32);
          cross_entropy_forward(at, chunk_.tp_, logits_, labels_, loss_sum_, ce_);
          if (mtp_) mtp_->loss_forward(at);
        },
        [this, &c](Stream& s) {
          ops::At at{s, ctx_.tally, nullptr, &c.kernels};
          g_logits_ = cross_entropy_backward(at, chunk_.tp_, logits_, labels_, ce_, loss_scale_);
          logits_ = Tensor();
          ce_ = {};
          lnf_all_ = chunk_.tp_.on()
                         ? gather_tokens(at, chunk_.tp_, lnf_, "sp_allgather_output_bwd")
                         : lnf_;
          g_lnf_ = ops::linear_dgrad(at, "output_layer", g_logits_, chunk_.output_.value,
                                     ops::one_group(g_logits_), c.dtype);
          if (chunk_.tp_.on())
            g_lnf_ = scatter_tokens(at, chunk_.tp_, g_lnf_, "sp_reducescatter_output_bwd");
          if (mtp_)  // the final norm's backward waits for MTP's gradient of its output
            mtp_->loss_backward(at, g_lnf_);
          else
            grad_hidden_ = ops::rmsnorm_dgrad(at, "final_layernorm", g_lnf_, hidden_,
                                              chunk_.final_norm_, rstd_);
        },
        [this](Stream& s) {
          ops::At at{s, ctx_.tally, nullptr, &chunk_.cfg_.kernels};
          ops::linear_wgrad(at, "output_layer", g_logits_, lnf_all_, ops::one_group(lnf_all_),
                            chunk_.output_);
          if (mtp_)
            mtp_->loss_dw(at);
          else
            ops::rmsnorm_wgrad(at, "final_layernorm", g_lnf_, hidden_, rstd_, chunk_.final_norm_);
          g_logits_ = g_lnf_ = lnf_ = lnf_all_ = hidden_ = rstd_ = Tensor();
        });
  }
  if (ctx.weights_ready && microbatch == ctx.microbatches - 1) announce_weight_gradients(decoder);
  if (ctx.parameters_needed && microbatch == 0) announce_parameter_uses(decoder);
}

void ChunkPlan::announce_parameter_uses(std::size_t decoder) {
  // Megatron's pre-hooks are per module; here per node: a layer's dense weights before its
  // pre_dispatch (attention, router, shared experts; a dense layer's MLP too, a node early), its
  // experts' before its mlp node. The MTP layer's prologue reads MTP's own weights, the final
  // norm and the embedding; the output layer is asked for there too (a node early).
  auto needs = [this](ScheduleNode& n, std::vector<Parameter*> params) {
    if (params.empty()) return;
    n.before_forward(
        [fn = ctx_.parameters_needed, params = std::move(params)](Stream& s) { fn(params, s); });
  };
  if (chunk_.spec_.pre_process) needs(embedding, {&chunk_.embedding_});
  for (std::size_t i = 0; i < layers.size(); ++i) {
    std::vector<Parameter*> dense, experts;
    for (Parameter* p : chunk_.layers_[i]->parameters()) (p->expert ? experts : dense).push_back(p);
    if (i == decoder) {  // the MTP layer
      for (Parameter* p : chunk_.mtp_->parameters()) dense.push_back(p);
      if (Parameter* e = chunk_.word_embedding()) dense.push_back(e);
      dense.push_back(&chunk_.final_norm_);
      dense.push_back(&chunk_.output_);
    }
    needs(layers[i]->pre_dispatch, std::move(dense));
    needs(layers[i]->mlp, std::move(experts));
  }
  if (chunk_.spec_.post_process) needs(loss, {&chunk_.final_norm_, &chunk_.output_});
}

void ChunkPlan::announce_weight_gradients(std::size_t decoder) {
  // Each decoder layer's weights are its own nodes' alone; the loss node's (the final norm and
  // the output layer) too, unless MTP shares them. The rest (the word embedding, MTP's) are
  // left for the reduction after the schedule, at most a node later than Megatron's hooks.
  auto announce = [this](std::vector<ScheduleNode*> nodes, std::vector<Parameter*> params) {
    auto g = std::make_shared<GradReady>();
    g->done = [fn = ctx_.weights_ready, params = std::move(params)](Stream& s) { fn(params, s); };
    for (ScheduleNode* n : nodes)
      if (n->has_weights()) {
        ++g->pending;
        n->completes(g);
      }
  };
  for (std::size_t i = 0; i < decoder; ++i)
    announce({&layers[i]->pre_dispatch, &layers[i]->mlp}, chunk_.layers_[i]->parameters());
  if (chunk_.spec_.post_process && !mtp_) announce({&loss}, {&chunk_.final_norm_, &chunk_.output_});
}

void ChunkPlan::fetch_batch(Stream& s) {
  // pretrain_gpt.py get_batch and megatron/core/utils.py get_batch_on_this_tp_rank: TP rank 0
  // takes the data loader's pinned batch to the device (`.cuda(non_blocking=True)`, on the
  // current stream) and every tensor is broadcast from it over the TP group: tokens and position
  // ids for a first stage, labels and the loss mask for a last one, all four with one stage or
  // MTP. Eager calls outside autograd: each costs the host a bare launch. NodeEmu's tokens and
  // labels are int32 (Megatron's int64), and the batch comes already cut for this CP rank
  // (Megatron copies the whole sequence and cuts it on the GPU, get_batch_on_this_cp_rank).
  // Position ids and the loss mask are copied as Megatron copies them; nothing here reads them
  // (RoPE's positions are the row's, and every token counts).
  const FrameworkScope eager(s.device().node(), FrameworkPass::None);
  Device& dev = s.device();
  const bool functional = !tokens_.is_meta();
  const auto T = std::size_t(tokens_.numel());
  const bool all = (chunk_.spec_.pre_process && chunk_.spec_.post_process) || chunk_.mtp_;
  const bool first = all || chunk_.spec_.pre_process, last = all || chunk_.spec_.post_process;
  TensorParallel& tp = chunk_.tp_;
  auto fetch = [&](const char* name, const Buffer& to, const void* values) {
    if (tp.rank == 0) {
      Buffer from = dev.allocate_host(to.bytes());
      if (functional) std::memcpy(from.data(), values, to.bytes());
      s.copy(to, from, to.bytes(), std::string("get_batch.") + name);
    }
    if (tp.on())
      tp.group.broadcast(to, to.bytes(), 0, s,
                         {.name = std::string("get_batch_broadcast.") + name});
  };
  std::vector<std::int64_t> positions;
  std::vector<float> mask;
  if (functional) {
    positions.resize(T);
    for (std::size_t i = 0; i < T; ++i) positions[i] = std::int64_t(i % std::size_t(data_.seq));
    mask.assign(T, 1.0f);
  }
  if (first) {
    fetch("tokens", tokens_.buffer(), data_.tokens.data());
    fetch("position_ids", Tensor::empty(dev, {std::int64_t(T)}, DType::I64).buffer(),
          positions.data());
  }
  if (last) {
    fetch("labels", labels_.buffer(), data_.labels.data());
    fetch("loss_mask", Tensor::empty(dev, {std::int64_t(T)}, DType::F32).buffer(), mask.data());
  }
}

ChunkPlan::~ChunkPlan() = default;

const Tensor& ChunkPlan::output() const {
  return layers.empty() ? input : layers.back()->output;
}

const Tensor& ChunkPlan::grad_input() const {
  return layers.empty() ? grad_output : layers.front()->grad_input;
}

void ChunkPlan::forward_all() {
  embedding.forward();
  for (auto& l : layers) {
    l->pre_dispatch.forward();
    l->dispatch.forward();
    l->mlp.forward();
    l->combine.forward();
    l->mtp.forward();
  }
  loss.forward();
}

void ChunkPlan::backward_all() {
  loss.backward();
  for (auto it = layers.rbegin(); it != layers.rend(); ++it) {
    auto& l = **it;
    l.mtp.backward();
    l.combine.backward();
    l.mlp.backward();
    l.dispatch.backward();
    l.pre_dispatch.backward();
  }
  embedding.backward();
}

}  // namespace nodeemu::layers
