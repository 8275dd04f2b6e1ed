#include "devices/detail/functional_rendezvous.hpp"

#include <algorithm>

#include "devices/check.hpp"
#include "devices/worker_pool.hpp"

namespace nodeemu::detail {

FunctionalRendezvous::FunctionalRendezvous(FunctionalExecutor& exec, int parties, int phases,
                                           std::string label)
    : exec_(&exec), parties_(parties), phases_(phases), label_(std::move(label)) {
  NE_CHECK(parties >= 1 && phases >= 1, "a rendezvous needs a party and a phase");
}

std::shared_ptr<FuncTask> FunctionalRendezvous::join(Party party,
                                                     const std::shared_ptr<FuncTask>& stream_last,
                                                     const std::shared_ptr<FuncTask>& event) {
  NE_CHECK(joined_ < parties_, "more parties joined a rendezvous than it has");
  NE_CHECK(static_cast<int>(party.bodies.size()) == phases_,
           "a rendezvous party needs one body per phase");
  if (barriers_.empty()) {
    // Named and numbered after the first party: the graph exists from its join on.
    for (int k = 0; k < phases_; ++k)
      barriers_.push_back(exec_->make(party.seq, -1, "", label_ + " barrier", nullptr, nullptr));
    done_ = exec_->make(party.seq, -1, "", label_, nullptr, nullptr);
  }
  // Phase 0 opens once every party's stream has got here: no party's buffers are touched before
  // their owner's earlier work is done.
  exec_->depend(barriers_[0], stream_last);
  exec_->depend(barriers_[0], event);
  // The buffers live until the whole operation ends: a party's own phase tasks may finish first
  // (a deferred exchange's receivers pull from the senders' buffers), and the host may have
  // dropped its last handle already.
  done_->keep.insert(done_->keep.end(), party.uses.begin(), party.uses.end());
  payload_bytes_ += party.payload_bytes;
  waiting_.push_back(std::move(party));
  if (++joined_ == parties_) wire();
  return done_;
}

void FunctionalRendezvous::wire() {
  // A small operation runs every party's part on one thread: waking a worker per party cost more
  // than the bytes (P thread switches per phase on a host with fewer cores than emulated GPUs: a
  // 64-byte all-to-all of 8 ranks took 370 us), and so did waking even one
  // (kInlineRendezvousBytes). One thread can do every part alone: a part waits only for a role
  // another thread holds (Exchange::run), and the bytes are the same whoever copies them. It runs
  // inline, with no pool: on the thread that makes it ready, often the last party's host, which
  // would otherwise hand it to a worker and wait.
  //
  // A larger one is dealt round-robin to as many threads as the execution budget has tokens: the
  // thread that makes it ready takes parties 0, T, 2T, ..., and party g's workers (g < T) the
  // parties g, g + T, ... Waking a worker per party, as before, put P parts on T cores, each
  // waiting for roles the others held: 8 x 256 KiB took 1.1 ms on 2 cores, dealt to 2 threads
  // 0.56-0.73 ms (bench/README, "The collective's own thread").
  const std::size_t threads =
      payload_bytes_ <= kInlineRendezvousBytes || waiting_.front().pool == nullptr
          ? 1
          : std::min(waiting_.size(), std::size_t(waiting_.front().pool->budget().tokens()));
  for (std::size_t i = 0; i < waiting_.size(); ++i) {
    Party& p = waiting_[i];
    const std::size_t thread = i % threads;
    WorkerPool* pool = thread == 0 ? nullptr : waiting_[thread].pool;
    for (int k = 0; k < phases_; ++k) {
      auto t = exec_->make(p.seq, p.device, p.stream, p.name,
                           std::move(p.bodies[static_cast<std::size_t>(k)]), pool);
      t->keep = p.uses;
      exec_->depend(t, barriers_[static_cast<std::size_t>(k)]);
      exec_->arm(t);
      // The next phase, or the end, waits for every party's part of this one.
      exec_->depend(k + 1 < phases_ ? barriers_[static_cast<std::size_t>(k + 1)] : done_, t);
    }
  }
  waiting_.clear();
  for (auto& b : barriers_) exec_->arm(b);
  exec_->arm(done_);
}

void FunctionalRendezvous::abandon(const std::string& why) {
  if (barriers_.empty()) return;  // nobody joined: nothing waits on it
  for (auto& b : barriers_) exec_->abandon(b, why);
  exec_->abandon(done_, why);
}

}  // namespace nodeemu::detail
