#include "devices/device.hpp"
#include "devices/errors.hpp"
#include "emu/step_context_impl.hpp"

namespace nodeemu::emu {

using layers::Tensor;

// --- PipelineLinks ---

PipelineLinks::PipelineLinks(Communicator& comm, const ProcessGroups& pg, int rank, Device& device)
    : device_(device) {
  const std::vector<int>& ring = pg.group_of(GroupKind::PP, rank);
  const int n = int(ring.size());
  if (n == 1) return;
  const int me = pg.rank_in(GroupKind::PP, rank);
  const int next = ring[std::size_t((me + 1) % n)], prev = ring[std::size_t((me + n - 1) % n)];
  // Member 0 sends, member 1 receives.
  auto link = [&](int from, int to, const char* dir) {
    return comm.group({from, to}, std::string("pp_") + dir + "_" + std::to_string(from) + "_" +
                                      std::to_string(to));
  };
  fwd_out_ = link(rank, next, "fwd");
  fwd_in_ = link(prev, rank, "fwd");
  bwd_out_ = link(rank, prev, "bwd");
  bwd_in_ = link(next, rank, "bwd");
  send_next_ = device.create_stream(Priority::Normal, "pp_send_next");
  send_prev_ = device.create_stream(Priority::Normal, "pp_send_prev");
}

Tensor PipelineLinks::recv(Group& g, const layers::Shape& shape, layers::DType dt, Stream& s,
                           const char* name) {
  Tensor t = Tensor::empty(device_, shape, dt);
  g.recv(0, t.buffer(), t.bytes(), s, {.async = true, .name = name});
  return t;
}

void PipelineLinks::send(Group& g, Stream& s, const Tensor& t, const Event& ready,
                         const char* name) {
  s.wait(ready);
  g.send(1, t.buffer(), t.bytes(), s, {.async = true, .name = name});
}

Tensor PipelineLinks::recv_forward(const layers::Shape& shape, layers::DType dt, Stream& s) {
  return recv(fwd_in_, shape, dt, s, "recv_forward");
}
void PipelineLinks::send_forward(const Tensor& t, const Event& ready) {
  send(fwd_out_, send_next_, t, ready, "send_forward");
}
Tensor PipelineLinks::recv_backward(const layers::Shape& shape, layers::DType dt, Stream& s) {
  return recv(bwd_in_, shape, dt, s, "recv_backward");
}
void PipelineLinks::send_backward(const Tensor& t, const Event& ready) {
  send(bwd_out_, send_prev_, t, ready, "send_backward");
}

// --- StepContext::Impl ---

StepContext::Impl::Impl(layers::ExecContext& ctx,
                        std::vector<std::unique_ptr<layers::ModelChunk>>& chunks,
                        PipelineLinks& links, int microbatches, int pp_rank, int pp_size, Data data,
                        double loss_scale, layers::Shape activation_shape)
    : ctx_(ctx),
      chunks_(chunks),
      links_(links),
      microbatches_(microbatches),
      pp_rank_(pp_rank),
      pp_size_(pp_size),
      data_(std::move(data)),
      loss_scale_(loss_scale),
      activation_shape_(std::move(activation_shape)) {}

static std::string describe(PlanId id) {
  return "micro-batch " + std::to_string(id.microbatch) + " of chunk " + std::to_string(id.chunk);
}

layers::ChunkPlan& StepContext::Impl::plan(PlanId id) {
  if (id.microbatch < 0 || id.microbatch >= microbatches_ || id.chunk < 0 || id.chunk >= chunks())
    throw UsageError("schedule: " + describe(id) + " does not exist (" +
                     std::to_string(microbatches_) + " micro-batches, " + std::to_string(chunks()) +
                     " chunks)");
  const auto key = std::make_pair(id.microbatch, id.chunk);
  if (released_.count(key))
    throw UsageError("schedule: " + describe(id) + " is used after its release");
  auto& p = plans_[key];
  if (!p) {
    p = chunks_[std::size_t(id.chunk)]->plan(ctx_, id.microbatch, data_(id.microbatch),
                                             loss_scale_);
    if (last_stage(id.chunk)) losses_[id.microbatch] = p->loss_sum_handle();
  }
  return *p;
}

layers::ChunkPlan& StepContext::Impl::existing(PlanId id, const char* what) {
  if (!plans_.count({id.microbatch, id.chunk}))
    throw UsageError(std::string("schedule: ") + what + " of " + describe(id) +
                     " before its forward");
  return plan(id);
}

void StepContext::Impl::recv_forward(PlanId id) {
  layers::ChunkPlan& p = plan(id);
  if (first_stage(id.chunk)) return;
  p.input = links_.recv_forward(activation_shape_, chunks_[0]->config().dtype, ctx_.compute);
  // The receive joins the plan's chain: the first node waits for it.
  ctx_.compute.record(p.event);
}

void StepContext::Impl::send_forward(PlanId id) {
  layers::ChunkPlan& p = existing(id, "send_forward");
  if (last_stage(id.chunk)) return;
  links_.send_forward(p.output(), p.event);
}

void StepContext::Impl::recv_backward(PlanId id) {
  layers::ChunkPlan& p = existing(id, "recv_backward");
  if (last_stage(id.chunk)) return;
  p.grad_output = links_.recv_backward(activation_shape_, chunks_[0]->config().dtype, ctx_.compute);
  ctx_.compute.record(p.event);
}

void StepContext::Impl::send_backward(PlanId id) {
  layers::ChunkPlan& p = existing(id, "send_backward");
  if (first_stage(id.chunk)) return;
  links_.send_backward(p.grad_input(), p.event);
}

void StepContext::Impl::release(PlanId id) {
  existing(id, "release");
  const auto key = std::make_pair(id.microbatch, id.chunk);
  plans_.erase(key);
  released_[key] = true;
}

void StepContext::Impl::check_finished(const std::string& schedule) const {
  for (int c = 0; c < chunks(); ++c)
    for (int mb = 0; mb < microbatches_; ++mb)
      if (!released_.count({mb, c}))
        throw UsageError("schedule '" + schedule + "' ended the step without the backward of " +
                         describe({mb, c}) +
                         "; every micro-batch needs forward_step and "
                         "backward_step (or combined_step)");
}

std::vector<std::shared_ptr<const double>> StepContext::Impl::loss_handles() const {
  std::vector<std::shared_ptr<const double>> out;
  for (const auto& [mb, h] : losses_) out.push_back(h);
  return out;
}

// --- StepContext ---

int StepContext::microbatches() const {
  return impl_.microbatches();
}
int StepContext::chunks() const {
  return impl_.chunks();
}
int StepContext::pp_rank() const {
  return impl_.pp_rank();
}
int StepContext::pp_size() const {
  return impl_.pp_size();
}
layers::ExecContext& StepContext::exec() {
  return impl_.exec();
}
layers::ChunkPlan& StepContext::plan(PlanId id) {
  return impl_.plan(id);
}
void StepContext::recv_forward(PlanId id) {
  impl_.recv_forward(id);
}
void StepContext::send_forward(PlanId id) {
  impl_.send_forward(id);
}
void StepContext::recv_backward(PlanId id) {
  impl_.recv_backward(id);
}
void StepContext::send_backward(PlanId id) {
  impl_.send_backward(id);
}
void StepContext::release(PlanId id) {
  impl_.release(id);
}

}  // namespace nodeemu::emu
