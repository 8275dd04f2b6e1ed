// A model chunk: the layers one pipeline stage (or one virtual stage) holds, with the embedding
// on the first and the final norm, output layer and cross-entropy loss on the last, so that a
// schedule can cut the model anywhere. A ChunkPlan is one micro-batch through the chunk: its
// schedule nodes, one event shared by all of them, and the tensors that enter and leave.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "comm/group.hpp"
#include "layers/mtp.hpp"
#include "layers/transformer_layer.hpp"
#include "layers/vocab_parallel.hpp"

namespace nodeemu::layers {

struct ChunkSpec {
  int first_layer = 0;
  int num_layers = 0;        // layers [first_layer, first_layer + num_layers)
  bool pre_process = true;   // holds the embedding
  bool post_process = true;  // holds the final norm, output layer and loss
};

// One micro-batch of token ids: [batch][seq] in sequence order.
struct MicroBatch {
  std::int64_t batch = 1, seq = 0;
  std::vector<std::int32_t> tokens, labels;
};

// Deterministic synthetic data: micro-batch `index` of data-parallel rank `dp_rank`.
MicroBatch synthetic_microbatch(const ModelConfig& cfg, std::int64_t batch, std::int64_t seq,
                                std::uint64_t seed, int dp_rank, int index);
// Meta mode's micro-batch: the shape, with every token and label 0. Nothing reads a meta batch's
// values (its tensors hold no data), and drawing them cost ~4 k normals per micro-batch and rank.
MicroBatch shape_only_microbatch(std::int64_t batch, std::int64_t seq);
// The positions of a micro-batch that CP rank `rank` of `size` holds: chunks rank and
// 2 * size - 1 - rank of each sequence cut into 2 * size (Megatron's get_batch_on_this_cp_rank;
// kernels::AttentionShape::position). size 1: the micro-batch itself.
MicroBatch context_parallel_slice(const MicroBatch& mb, int size, int rank);

class ChunkPlan;

class ModelChunk {
 public:
  // `ep` is this rank's EP group, used by MoE layers; `tp` its TP group (tensor_parallel.hpp);
  // `etp` its expert-TP group; `cp` its CP group (context_parallel.hpp).
  ModelChunk(const ModelConfig& cfg, ChunkSpec spec, Device& device, std::uint64_t seed, Group ep,
             int rank, TensorParallel tp = {}, TensorParallel etp = {}, ContextParallel cp = {});
  ~ModelChunk();
  const ChunkSpec& spec() const { return spec_; }
  const ModelConfig& config() const { return cfg_; }
  std::vector<Parameter*> parameters();
  // The decoder layers, then (on the last stage with MTP) the MTP layer's transformer layer.
  std::vector<std::unique_ptr<TransformerLayer>>& layers() { return layers_; }
  bool has_mtp() const { return static_cast<bool>(mtp_); }
  // The word embedding this chunk holds: the first stage's, or the last stage's copy for MTP
  // (null if neither); its gradient is all-reduced over the embedding group.
  Parameter* word_embedding();
  Device& device() const { return device_; }
  // Zeroes every main_grad and the expert bias's step counts, as device operations on `s`.
  void zero_grad(Stream& s, WorkTally* tally = nullptr);
  // Each MoE layer's expert-bias update (TransformerLayer::update_expert_bias) over `stage`,
  // this pipeline stage's TP x CP x DP ranks.
  void update_expert_bias(Group stage, Stream& s, WorkTally* tally = nullptr);
  // `loss_scale` multiplies the loss's (and the router losses') gradient: 1 / (tokens of the
  // global batch) for a token-mean loss.
  std::unique_ptr<ChunkPlan> plan(ExecContext& ctx, int microbatch, const MicroBatch& data,
                                  double loss_scale);

 private:
  friend class ChunkPlan;
  ModelConfig cfg_;
  ChunkSpec spec_;
  Device& device_;
  TensorParallel tp_;
  Parameter embedding_, final_norm_, output_;
  std::vector<std::unique_ptr<TransformerLayer>> layers_;
  std::unique_ptr<MtpWeights> mtp_;
  // MTP on a last stage without the embedding: its copy of the word embedding, drawn from the
  // same stream as the first stage's (Megatron zero-fills it and all-reduces it over the
  // embedding group at setup: the same values).
  Parameter mtp_embedding_;
};

class ChunkPlan {
 public:
  ChunkPlan(ModelChunk& chunk, ExecContext& ctx, int microbatch, const MicroBatch& data,
            double loss_scale);
  ~ChunkPlan();
  Event event;             // shared by every node of this plan (declared first: nodes point at it)
  ScheduleNode embedding;  // forward: lookup; backward_dw: the table's gradient
  std::vector<std::unique_ptr<LayerPlan>> layers;
  ScheduleNode loss;  // final norm, output layer, cross-entropy (and their backward)
  // Set by the schedule when the chunk does not start (end) the model: the activation from the
  // previous stage, and the gradient from the next.
  Tensor input, grad_output;
  // The chunk's output activation (no post_process), and the gradient of its input (no
  // pre_process), for the pipeline sends.
  const Tensor& output() const;
  const Tensor& grad_input() const;
  // The summed token loss of this micro-batch (host, once the loss kernel has run for real).
  double loss_sum() const { return *loss_sum_; }
  // The MTP loss's term of the objective (0 without MTP), scaled as its gradient is.
  double mtp_loss_term() const { return mtp_ ? mtp_->loss_term() : 0.0; }
  // The MTP layer's summed token cross-entropy (its masked positions count 0); null without MTP.
  std::shared_ptr<const double> mtp_loss_sum_handle() const {
    return mtp_ ? mtp_->loss_sum_handle() : nullptr;
  }
  // The same value through a handle that outlives the plan (a schedule drops plans after their
  // backward; the loop reads the losses after the step's synchronize).
  std::shared_ptr<const double> loss_sum_handle() const { return loss_sum_; }
  // Everything in order on the context's streams: embedding, then each layer's nodes, then the
  // loss; backward in reverse. The sequential reference, and what schedules are checked against.
  void forward_all();
  void backward_all();

 private:
  // overlap_grad_reduce, on the step's last micro-batch: tell ctx.weights_ready when each
  // layer's weight gradients are complete.
  void announce_weight_gradients(std::size_t decoder);
  // overlap_param_gather, on the step's first micro-batch: tell ctx.parameters_needed before
  // each node's forward which weights it reads.
  void announce_parameter_uses(std::size_t decoder);
  // Megatron's get_batch on a first or last (virtual) stage: the batch to the device and over
  // the TP group (model_chunk.cpp says how).
  void fetch_batch(Stream& s);

  ModelChunk& chunk_;
  ExecContext& ctx_;
  MicroBatch data_;
  double loss_scale_;
  Tensor tokens_, labels_, embedded_, hidden_, rstd_, logits_, lnf_, lnf_all_, grad_hidden_, g_lnf_,
      g_logits_, g_embedded_;
  CrossEntropySaved ce_;
  std::shared_ptr<double> loss_sum_ = std::make_shared<double>(0);
  std::unique_ptr<MtpPlan> mtp_;
};

}  // namespace nodeemu::layers
