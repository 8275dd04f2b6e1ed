#include "offload/offload_engine.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <tuple>

#include "devices/check.hpp"
#include "devices/device.hpp"
#include "devices/node.hpp"
#include "offload/hazard_checker.hpp"

namespace nodeemu::offload {

namespace {

using layers::ModuleId;
using layers::SavedTensorId;
using layers::Tensor;

// Four independent lanes of 64-bit words folded with a multiply, so the loop is not one long
// dependency chain: about memory speed, cheap enough to check every reload.
std::uint64_t checksum(const void* data, std::size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint64_t h[4] = {0x9e3779b97f4a7c15ull ^ n, 0xc2b2ae3d27d4eb4full, 0x165667b19e3779f9ull,
                        0x27d4eb2f165667c5ull};
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int l = 0; l < 4; ++l) {
      std::uint64_t w;
      std::memcpy(&w, p + i + 8 * l, 8);
      h[l] = (h[l] ^ w) * 0x100000001b3ull;
    }
  std::uint64_t out = h[0] ^ (h[1] << 1) ^ (h[2] << 2) ^ (h[3] << 3);
  for (; i < n; ++i) out = (out ^ p[i]) * 0x100000001b3ull;
  return out ^ (out >> 29);
}

using TensorKey = std::tuple<int, int, std::string, std::string>;  // layer, mb, module, tensor

TensorKey key_of(const SavedTensorId& id) {
  return {id.owner.layer, id.owner.microbatch, id.owner.module, id.tensor};
}

std::string label(const SavedTensorId& id) {
  return id.owner.module + "." + id.tensor;
}

bool contains(const std::vector<std::string>& xs, const std::string& x) {
  return std::find(xs.begin(), xs.end(), x) != xs.end();
}

// What a functional-mode reload check found wrong; reported by end_iteration.
struct Verification {
  std::atomic<std::uint64_t> verified{0};
  std::mutex mu;
  std::string failure;
  SavedTensorId failed;
};

struct Entry {
  SavedTensorId id;
  Tensor device;    // until its D2H is enqueued; for a kept group, until released
  Tensor reloaded;  // from the reload until released
  layers::Shape shape;
  layers::DType dtype = layers::DType::F32;
  std::size_t bytes = 0;
  PinnedHostPool::Lease host;
  std::shared_ptr<std::uint64_t> sum = std::make_shared<std::uint64_t>(0);
};

struct Group {
  GroupKey key;
  int microbatch = 0;
  int chunk = 0;  // of this rank: the handler is (microbatch, chunk)
  std::deque<Entry> entries;
  std::uint64_t bytes = 0;
  bool offloaded = false, reload_issued = false;
  bool prefetched = false;  // its backward's end has prefetched the next group
  std::size_t released = 0;
  Event produced, offloaded_ev, reloaded_ev, backward_end;
  HazardChecker::Stamp d2h, h2d;
  Stream last_stream;               // where its backward last read it
  std::vector<const void*> waited;  // streams that waited for the reload
};

}  // namespace

struct OffloadEngine::Impl {
  Impl(Device& d, OffloadConfig c)
      : device(d),
        cfg(std::move(c)),
        d2h(d.create_stream(Priority::Normal, "offload_d2h")),
        h2d(d.create_stream(Priority::Normal, "offload_h2d")),
        pool(d),
        functional(d.node().mode() == Mode::Functional) {}

  Device& device;
  OffloadConfig cfg;
  Stream d2h, h2d;
  PinnedHostPool pool;
  HazardChecker checker;
  bool functional;
  Fault fault = Fault::None;

  bool warm = false;  // the warm-up iteration has ended
  OffloadPlan plan;
  WarmupRecord record;                                    // what the warm-up saw
  std::map<std::pair<int, int>, std::size_t> handler_of;  // (micro-batch, chunk) -> record index
  std::vector<IterationStats> done;
  IterationStats now;
  // This iteration: how far backward has gone through record.backward_order (Megatron's
  // _cached_chunks_index_backward), and the offload events pending per group name.
  std::size_t backward_index = 0;
  std::map<std::string, std::deque<Event*>> pending_by_name;

  std::deque<Group> groups;  // this iteration's, in commit order (stable addresses)
  // Groups started and not yet committed: a norm's group spans the modules after it.
  std::map<std::tuple<int, int, std::string>, Group*> open;  // layer, micro-batch, name
  std::map<TensorKey, std::pair<Group*, Entry*>> index;
  // The groups holding a module's tensors (its own group, or a tensor name's), for the module's
  // backward boundaries.
  std::map<std::tuple<int, int, std::string>, std::vector<Group*>> by_owner;  // layer, mb, module
  std::map<std::size_t, std::vector<Group*>> stacks;  // per chunk handler, commit order
  std::map<std::size_t, std::size_t> committed;       // per chunk handler, this iteration
  std::shared_ptr<Verification> verification = std::make_shared<Verification>();

  Group& new_group(int layer, std::string name, int microbatch) {
    Group& g = groups.emplace_back();
    g.key = {microbatch, layer, std::move(name)};
    g.microbatch = microbatch;
    const auto& firsts = cfg.chunk_first_layers;
    g.chunk = int(std::upper_bound(firsts.begin(), firsts.end(), layer) - firsts.begin()) - 1;
    g.chunk = std::max(g.chunk, 0);
    // Megatron's handler lists a group when it starts (on_group_start_forward), empty or not.
    if (!warm) record.handlers[handler(g)].groups.push_back({g.key, 0});
    return g;
  }

  std::size_t handler(const Group& g) {
    auto [it, fresh] = handler_of.emplace(std::make_pair(g.microbatch, g.chunk), 0);
    if (fresh) {
      NE_CHECK(!warm, "offload: a chunk handler the warm-up did not see");
      it->second = record.handlers.size();
      record.handlers.push_back({g.microbatch, g.chunk, {}});
    }
    return it->second;
  }

  // ChunkOffloadHandler.should_bulk_offload's run-time rule: the last group of its name in the
  // handler whose backward runs next stays, its reload would be needed at once.
  bool needed_next(const Group& g) {
    const std::size_t h = handler(g);
    std::size_t front = record.handlers.size();
    for (std::size_t i = backward_index; i < record.backward_order.size(); ++i) {
      const auto& recorded = record.handlers[record.backward_order[i]].groups;
      if (std::any_of(recorded.begin(), recorded.end(),
                      [&](const GroupRecord& r) { return r.key.name == g.key.name; })) {
        front = record.backward_order[i];
        break;
      }
    }
    if (front != h) return false;
    const auto& mine = record.handlers[h].groups;
    auto at = std::find_if(mine.begin(), mine.end(),
                           [&](const GroupRecord& r) { return r.key == g.key; });
    return at != mine.end() && std::none_of(at + 1, mine.end(), [&](const GroupRecord& r) {
             return r.key.name == g.key.name;
           });
  }

  // Takes `t` into `g` (the layer keeps an empty handle; tensor_needed gives it back).
  void capture(Group& g, const SavedTensorId& id, Tensor& t) {
    if (!t || t.numel() < cfg.min_tensor_elements) return;
    Entry& e = g.entries.emplace_back();
    e.id = id;
    e.shape = t.shape();
    e.dtype = t.dtype();
    e.bytes = t.bytes();
    e.device = std::move(t);
    t = Tensor();
    g.bytes += e.bytes;
    index[key_of(id)] = {&g, &e};
    auto& owned = by_owner[{id.owner.layer, id.owner.microbatch, id.owner.module}];
    if (owned.empty() || owned.back() != &g) owned.push_back(&g);
  }

  // Backward is about to read g's tensors on `s`: its reload is issued if no prefetch did it,
  // and `s` waits for it (once per stream).
  void make_resident(Group& g, Stream& s, const SavedTensorId& id) {
    g.last_stream = s;
    backward_reached(g);
    if (!g.offloaded) return;
    if (!g.reload_issued) {
      if (fault == Fault::SkipReload)
        throw OffloadHazard(label(id), id.owner.layer, id.owner.microbatch,
                            "backward reads the device copy that was released when its group was "
                            "offloaded; no reload was issued for it");
      reload(g);
      ++now.reloads_on_demand;
    }
    if (std::find(g.waited.begin(), g.waited.end(), s.state()) == g.waited.end()) {
      if (fault != Fault::ComputeWithoutReloadWait) wait(s, g.reloaded_ev);
      g.waited.push_back(s.state());
    }
  }

  std::vector<Group*>* owned_by(const layers::ModuleId& m) {
    auto it = by_owner.find({m.layer, m.microbatch, m.module});
    return it == by_owner.end() ? nullptr : &it->second;
  }

  void wait(Stream& s, Event& e) {
    s.wait(e);
    checker.wait(s, e);
  }
  void record_event(Stream& s, Event& e) {
    s.record(e);
    checker.record(s, e);
  }

  void commit(Group& g, Stream& s) {
    const std::size_t h = handler(g);
    ++committed[h];  // every group started in the handler, for pre_reload's "forward done"
    if (g.entries.empty()) return;
    stacks[h].push_back(&g);
    if (!warm)
      for (auto& r : record.handlers[h].groups)
        if (r.key == g.key) r.bytes = g.bytes;
    if (warm && (!plan.offloads(g.key) || needed_next(g))) {
      ++now.groups_kept;
      return;
    }
    record_event(s, g.produced);
    wait(d2h, g.produced);
    for (Entry& e : g.entries) {
      e.host = pool.acquire(e.bytes);
      // A reused buffer: its last reload must have read it before this copy writes it.
      if (e.host.last_read) wait(d2h, *e.host.last_read);
      std::function<void()> then;
      if (functional && cfg.verify) {
        const void* p = e.host.buffer.data();
        then = [p, n = e.bytes, sum = e.sum] { *sum = checksum(p, n); };
      }
      d2h.copy(e.host.buffer, e.device.buffer(), e.bytes,
               "offload L" + std::to_string(g.key.layer) + " " + label(e.id), std::move(then));
      g.d2h = checker.issue(d2h);
      e.device = Tensor();  // released: the memory returns once the copy has read it
    }
    record_event(d2h, g.offloaded_ev);
    g.offloaded = true;
    ++now.groups_offloaded;
    now.bytes_offloaded += g.bytes;
    // max_inflight_offloads (_drain_offload_pending): the committing stream waits for this
    // name's older offloads while more than the cap are pending.
    if (cfg.max_inflight) {
      auto& q = pending_by_name[g.key.name];
      q.push_back(&g.offloaded_ev);
      while (int(q.size()) > *cfg.max_inflight) {
        wait(s, *q.front());
        q.pop_front();
      }
    }
  }

  void reload(Group& g) {
    if (fault != Fault::ReloadWithoutOffloadWait) wait(h2d, g.offloaded_ev);
    if (!checker.ordered(g.d2h, h2d))
      throw OffloadHazard(label(g.entries.front().id), g.key.layer, g.microbatch,
                          "the reload would read its pinned host buffer before the D2H that "
                          "fills it has completed: the H2D stream never waited for the group's "
                          "offload event (the race of Megatron-LM #7398)");
    auto read_done = std::make_shared<Event>();
    for (Entry& e : g.entries) {
      // The H2D overwrites every byte: no zero-fill (a caching allocator's block).
      // Allocated for the H2D stream, as Megatron's reload allocates inside its stream context:
      // the block goes back to that stream's pool when backward drops it.
      e.reloaded =
          Tensor(device.allocate_uninitialized(std::max<std::size_t>(e.bytes, 1), {}, &h2d),
                 e.shape, e.dtype);
      std::function<void()> then;
      if (functional && cfg.verify) {
        const void* p = e.reloaded.buffer().data();
        then = [p, n = e.bytes, sum = e.sum, v = verification, id = e.id] {
          if (checksum(p, n) == *sum) {
            ++v->verified;
            return;
          }
          std::lock_guard<std::mutex> lock(v->mu);
          if (v->failure.empty()) {
            v->failure = "the reloaded bytes differ from the bytes that were offloaded";
            v->failed = id;
          }
        };
      }
      h2d.copy(e.reloaded.buffer(), e.host.buffer, e.bytes,
               "reload L" + std::to_string(g.key.layer) + " " + label(e.id), std::move(then));
      g.h2d = checker.issue(h2d);
    }
    record_event(h2d, g.reloaded_ev);
    record_event(h2d, *read_done);
    for (Entry& e : g.entries) {
      e.host.last_read = read_done;
      pool.release(std::move(e.host));
      e.host = {};
    }
    g.reload_issued = true;
    now.bytes_reloaded += g.bytes;
  }

  // Backward has reached g's handler: in the warm-up it joins the backward order; after, the
  // handlers before it in that order are done (pop_backward_chunk).
  void backward_reached(const Group& g) {
    const std::size_t h = handler(g);
    auto& order = record.backward_order;
    auto at = std::find(order.begin(), order.end(), h);
    if (!warm && at == order.end()) {
      order.push_back(h);
      at = order.end() - 1;
    }
    if (at != order.end())
      backward_index = std::max(backward_index, std::size_t(at - order.begin()) + 1);
  }

  // The group's backward is over on `s` (on_group_start_backward): the H2D stream waits for it
  // and prefetches the next offloaded group of its handler, LIFO (bulk_reload). With none left,
  // it pre-reloads the last offloaded group of the handler whose backward runs next, if its
  // forward is done (pre_reload_last_layer), so that the first reload of a handler is hidden too.
  void prefetch_after(Group& g, Stream& s) {
    if (g.prefetched) return;
    g.prefetched = true;
    const std::size_t h = handler(g);
    auto& stack = stacks[h];
    auto it = std::find(stack.begin(), stack.end(), &g);
    NE_CHECK(it != stack.end(), "offload: ended group not on its handler's stack");
    Group* next = nullptr;
    while (it != stack.begin() && !next) {
      Group& p = **--it;
      if (p.offloaded && !p.reload_issued) next = &p;
    }
    if (!next && warm && backward_index < record.backward_order.size()) {
      const std::size_t n = record.backward_order[backward_index];
      auto& later = stacks[n];
      if (n != h && committed[n] == record.handlers[n].groups.size())
        for (auto p = later.rbegin(); p != later.rend() && !next; ++p)
          if ((*p)->offloaded && !(*p)->reload_issued) next = *p;
    }
    if (!next) return;
    if (s.state()) {  // unset when backward never read the group
      record_event(s, g.backward_end);
      wait(h2d, g.backward_end);
    }
    reload(*next);
  }
};

OffloadEngine::OffloadEngine(Device& device, OffloadConfig config) {
  config.validate();
  impl_ = std::make_unique<Impl>(device, std::move(config));
}

OffloadEngine::~OffloadEngine() = default;

void OffloadEngine::begin_iteration() {
  Impl& m = *impl_;
  m.groups.clear();
  m.index.clear();
  m.by_owner.clear();
  m.stacks.clear();
  m.committed.clear();
  m.pending_by_name.clear();
  m.backward_index = 0;
  m.open.clear();
  m.now = {};
}

void OffloadEngine::end_iteration() {
  Impl& m = *impl_;
  m.checker.synchronize();
  // Buffers of groups that were never reloaded (a forward without backward) go back as well.
  for (Group& g : m.groups)
    for (Entry& e : g.entries)
      if (e.host.buffer) m.pool.release(std::move(e.host));
  {
    std::lock_guard<std::mutex> lock(m.verification->mu);
    if (!m.verification->failure.empty()) {
      const SavedTensorId id = m.verification->failed;
      throw OffloadHazard(label(id), id.owner.layer, id.owner.microbatch, m.verification->failure);
    }
  }
  m.now.tensors_verified = m.verification->verified.exchange(0);
  m.done.push_back(m.now);
  if (!m.warm) {
    m.plan = plan_after_warmup(m.record, m.cfg);
    m.warm = true;
  }
  begin_iteration();
}

const OffloadPlan& OffloadEngine::plan() const {
  return impl_->plan;
}
const WarmupRecord& OffloadEngine::warmup() const {
  return impl_->record;
}
const std::vector<IterationStats>& OffloadEngine::iterations() const {
  return impl_->done;
}
const OffloadConfig& OffloadEngine::config() const {
  return impl_->cfg;
}
const PinnedHostPool& OffloadEngine::host_pool() const {
  return impl_->pool;
}
void OffloadEngine::inject_fault(Fault f) {
  impl_->fault = f;
}

void OffloadEngine::module_start(const ModuleId& m, Stream&) {
  Impl& im = *impl_;
  if (contains(im.cfg.modules, m.module))
    im.open[{m.layer, m.microbatch, m.module}] = &im.new_group(m.layer, m.module, m.microbatch);
}

void OffloadEngine::module_end(const ModuleId& m, Stream& s) {
  Impl& im = *impl_;
  auto it = im.open.find({m.layer, m.microbatch, m.module});
  if (it == im.open.end()) return;
  Group* g = it->second;
  im.open.erase(it);
  im.commit(*g, s);
}

void OffloadEngine::tensor_saved(const SavedTensorId& id, Tensor& t, Stream& s) {
  Impl& im = *impl_;
  auto it = im.open.find({id.owner.layer, id.owner.microbatch, id.owner.module});
  if (it != im.open.end()) {
    im.capture(*it->second, id, t);
  } else if (contains(im.cfg.tensors, id.tensor)) {
    Group& own = im.new_group(id.owner.layer, id.tensor, id.owner.microbatch);
    im.capture(own, id, t);
    im.commit(own, s);
  }
}

void OffloadEngine::tensor_needed(const SavedTensorId& id, Tensor& t, Stream& s) {
  Impl& im = *impl_;
  auto it = im.index.find(key_of(id));
  if (it == im.index.end()) return;
  auto [g, e] = it->second;
  im.make_resident(*g, s, id);
  if (!g->offloaded) {
    t = e->device;
    return;
  }
  if (!im.checker.ordered(g->h2d, s))
    throw OffloadHazard(label(id), id.owner.layer, id.owner.microbatch,
                        "backward on stream '" + s.name() +
                            "' would read the reloaded copy before its H2D has completed: the "
                            "stream never waited for the group's reload event");
  t = e->reloaded;
}

void OffloadEngine::tensor_released(const SavedTensorId& id) {
  Impl& im = *impl_;
  auto it = im.index.find(key_of(id));
  if (it == im.index.end()) return;
  auto [g, e] = it->second;
  im.index.erase(it);
  e->device = e->reloaded = Tensor();
  // A group whose module reported no backward end prefetches once its tensors are all released.
  if (++g->released == g->entries.size()) im.prefetch_after(*g, g->last_stream);
}

void OffloadEngine::module_backward_start(const ModuleId& m, Stream& s) {
  Impl& im = *impl_;
  if (auto* owned = im.owned_by(m))
    for (Group* g : *owned)
      if (!g->entries.empty()) im.make_resident(*g, s, g->entries.front().id);
}

void OffloadEngine::module_backward_end(const ModuleId& m, Stream& s) {
  Impl& im = *impl_;
  if (auto* owned = im.owned_by(m))
    for (Group* g : *owned) im.prefetch_after(*g, s);
}

}  // namespace nodeemu::offload
