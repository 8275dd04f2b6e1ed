#include "devices/device.hpp"
#include "devices/errors.hpp"
#include "emu/step_context_impl.hpp"

namespace nodeemu::emu {

using layers::Tensor;

// --- PipelineLinks ---

PipelineLinks::PipelineLinks(Communicator& comm, const ProcessGroups& pg, int rank, Device& device,
                             PipelineComm mode)
    : device_(device), mode_(mode) {
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
  recv_prev_ = device.create_stream(Priority::Normal, "pp_recv_prev");
  recv_next_ = device.create_stream(Priority::Normal, "pp_recv_next");
}

PipelineLinks::Received PipelineLinks::recv(Group& g, Stream& link, const layers::Shape& shape,
                                            layers::DType dt, Stream& posting, const char* name) {
  Event queued;
  posting.record(queued);
  link.wait(queued);
  Received r{Tensor::empty(device_, shape, dt), Event()};
  g.recv(0, r.tensor.buffer(), r.tensor.bytes(), link, {.async = true, .name = name});
  link.record(r.done);
  return r;
}

Event PipelineLinks::send(Group& g, Stream& link, const Tensor& t, const Event& ready,
                          Stream& posting, const char* name) {
  Event queued;
  posting.record(queued);
  link.wait(queued);
  link.wait(ready);
  g.send(1, t.buffer(), t.bytes(), link, {.async = true, .name = name});
  Event done;
  link.record(done);
  return done;
}

PipelineLinks::Received PipelineLinks::recv_forward(const layers::Shape& shape, layers::DType dt,
                                                    Stream& posting) {
  return recv(fwd_in_, recv_prev_, shape, dt, posting, "recv_forward");
}
PipelineLinks::Received PipelineLinks::recv_backward(const layers::Shape& shape, layers::DType dt,
                                                     Stream& posting) {
  return recv(bwd_in_, recv_next_, shape, dt, posting, "recv_backward");
}
Event PipelineLinks::send_forward(const Tensor& t, const Event& ready, Stream& posting) {
  return send(fwd_out_, send_next_, t, ready, posting, "send_forward");
}
Event PipelineLinks::send_backward(const Tensor& t, const Event& ready, Stream& posting) {
  return send(bwd_out_, send_prev_, t, ready, posting, "send_backward");
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
    if (last_stage(id.chunk) && p->mtp_loss_sum_handle())
      mtp_losses_[id.microbatch] = p->mtp_loss_sum_handle();
    if (on_progress_) on_progress_();
  }
  return *p;
}

layers::ChunkPlan& StepContext::Impl::existing(PlanId id, const char* what) {
  if (!plans_.count({id.microbatch, id.chunk}))
    throw UsageError(std::string("schedule: ") + what + " of " + describe(id) +
                     " before its forward");
  return plan(id);
}

void StepContext::Impl::communicate(const P2pCall& call, layers::StreamKind from) {
  Stream& posting = ctx_.stream(from);
  const layers::DType dt = chunks_[0]->config().dtype;
  std::vector<Event> sends;
  std::vector<std::pair<PlanId, bool>> received;  // (plan, forward)
  auto send_prev = [&] {
    if (!call.send_backward || first_stage(call.send_backward->chunk)) return;
    layers::ChunkPlan& p = existing(*call.send_backward, "send_backward");
    sends.push_back(links_.send_backward(p.grad_input(), p.event, posting));
  };
  auto send_next = [&] {
    if (!call.send_forward || last_stage(call.send_forward->chunk)) return;
    layers::ChunkPlan& p = existing(*call.send_forward, "send_forward");
    sends.push_back(links_.send_forward(p.output(), p.event, posting));
  };
  // A receive into a new tensor of the plan, left pending until the consumer waits for it.
  auto receive = [&](PlanId id, bool forward) {
    const Key key{id.microbatch, id.chunk};
    auto& pending = forward ? fwd_pending_ : bwd_pending_;
    auto& arrived = forward ? fwd_arrived_ : bwd_arrived_;
    if (pending.count(key) || arrived.count(key))
      throw UsageError(std::string("schedule: ") + (forward ? "recv_forward" : "recv_backward") +
                       " of " + describe(id) + " posted twice");
    layers::ChunkPlan& p = forward ? plan(id) : existing(id, "recv_backward");
    auto r = forward ? links_.recv_forward(activation_shape_, dt, posting)
                     : links_.recv_backward(activation_shape_, dt, posting);
    (forward ? p.input : p.grad_output) = r.tensor;
    pending[key] = r.done;
    received.emplace_back(id, forward);
  };
  auto recv_prev = [&] {
    if (call.recv_forward && !first_stage(call.recv_forward->chunk))
      receive(*call.recv_forward, true);
  };
  auto recv_next = [&] {
    if (call.recv_backward && !last_stage(call.recv_backward->chunk))
      receive(*call.recv_backward, false);
  };
  // Megatron's _p2p_ops order: even PP ranks send-next, recv-prev, send-prev, recv-next; odd ranks
  // recv-prev, send-next, recv-next, send-prev, so that neighbours post matching transfers in the
  // same order. Each link is its own group and stream, but with one hardware queue
  // (CUDA_DEVICE_MAX_CONNECTIONS=1) the completion record behind a transfer holds the queue until
  // the peer has posted its side: posting both sends first (as batch_isend_irecv's order would,
  // unfused) deadlocks the two neighbours.
  if (pp_rank_ % 2 == 0) {
    send_next();
    recv_prev();
    send_prev();
    recv_next();
  } else {
    recv_prev();
    send_next();
    recv_next();
    send_prev();
  }
  // The comm stream's post_forward (the combined 1F1B; schedules.py pp_post_forward): after
  // posting this send it waits on the previous forward send's handle (send_next_wait_handle)
  // before deallocate_output_tensor frees that output, so the comm stream's next work queues
  // behind the transfer one step back.
  if (from == layers::StreamKind::Comm && !sends.empty()) {
    if (comm_send_in_flight_) posting.wait(*comm_send_in_flight_);
    comm_send_in_flight_ = sends.back();
  }
  if (links_.mode().overlap) return;
  // wait_on_reqs: req.wait() on each request makes the posting stream wait for it.
  for (const Event& e : sends) posting.wait(e);
  for (const auto& [id, forward] : received) forward ? recv_forward(id) : recv_backward(id);
  if (links_.mode().batch && (!sends.empty() || !received.empty()))
    posting.device().synchronize();  // batch_p2p_sync: torch.cuda.synchronize()
}

void StepContext::Impl::consume(std::map<Key, Event>& pending, std::set<Key>& arrived, Key key,
                                PlanId id, bool forward) {
  if (arrived.count(key)) return;
  auto it = pending.find(key);
  if (it == pending.end()) {
    // Not posted ahead: a call of its own.
    P2pCall c;
    (forward ? c.recv_forward : c.recv_backward) = id;
    communicate(c);
    if (arrived.count(key)) return;  // a blocking call consumed it
    it = pending.find(key);
  }
  // The receive joins the plan's chain: the plan's next node waits for it.
  ctx_.compute.wait(it->second);
  ctx_.compute.record(plan(id).event);
  pending.erase(it);
  arrived.insert(key);
}

void StepContext::Impl::recv_forward(PlanId id) {
  plan(id);
  if (first_stage(id.chunk)) return;
  consume(fwd_pending_, fwd_arrived_, {id.microbatch, id.chunk}, id, true);
}

void StepContext::Impl::recv_backward(PlanId id) {
  existing(id, "recv_backward");
  if (last_stage(id.chunk)) return;
  consume(bwd_pending_, bwd_arrived_, {id.microbatch, id.chunk}, id, false);
}

void StepContext::Impl::release(PlanId id) {
  existing(id, "release");
  const auto key = std::make_pair(id.microbatch, id.chunk);
  if (fwd_pending_.count(key) || bwd_pending_.count(key))
    throw UsageError("schedule: " + describe(id) + " is released with a receive not waited for");
  plans_.erase(key);
  released_[key] = true;
  if (on_progress_) on_progress_();
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

std::vector<std::shared_ptr<const double>> StepContext::Impl::mtp_loss_handles() const {
  std::vector<std::shared_ptr<const double>> out;
  for (const auto& [mb, h] : mtp_losses_) out.push_back(h);
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
void StepContext::communicate(const P2pCall& call) {
  impl_.communicate(call);
}
const PipelineComm& StepContext::pipeline_comm() const {
  return impl_.pipeline_comm();
}
void StepContext::recv_forward(PlanId id) {
  impl_.recv_forward(id);
}
void StepContext::recv_backward(PlanId id) {
  impl_.recv_backward(id);
}
void StepContext::send_forward(PlanId id, layers::StreamKind from) {
  impl_.communicate({.send_forward = id}, from);
}
void StepContext::send_backward(PlanId id) {
  impl_.communicate({.send_backward = id});
}
void StepContext::release(PlanId id) {
  impl_.release(id);
}

}  // namespace nodeemu::emu
