#include "emu/over_budget.hpp"

#include <algorithm>
#include <numeric>

#include "devices/check.hpp"
#include "devices/device.hpp"
#include "devices/node.hpp"

namespace nodeemu::emu {

namespace {

template <class F>
void each_dispatcher(Chunks& chunks, F f) {
  for (auto& c : chunks)
    for (auto& l : c->layers())
      if (layers::TokenDispatcher* d = l->dispatcher()) f(*d);
}

}  // namespace

int ranks_over_budget(Chunks& chunks, Group& world, Stream& s, std::vector<int>& shared,
                      int round) {
  Device& dev = s.device();
  const bool functional = dev.node().mode() == Mode::Functional;
  const std::size_t n = std::size_t(world.size());
  NE_CHECK(shared.size() == 2 * n, "ranks_over_budget: two rounds of one slot per rank");
  int* slots = shared.data() + std::size_t(round % 2) * n;
  // The flag as a float, so that the all-reduce's sum counts the ranks.
  Buffer flag = dev.allocate(sizeof(float));
  std::function<void()> body;
  if (functional)
    body = [&chunks, out = flag.as<float>()] {
      bool any = false;
      each_dispatcher(chunks, [&](layers::TokenDispatcher& d) { any |= d.over_budget(); });
      *out = any ? 1.0f : 0.0f;
    };
  else {
    bool any = false;
    each_dispatcher(chunks, [&](layers::TokenDispatcher& d) { any |= d.over_budget(); });
    slots[std::size_t(world.index_of(dev.id()))] = any;
  }
  s.launch({"over_budget_flags",
            Work{.bytes = 64, .shape = KernelShape::memory(MemoryOp::Elementwise)},
            std::move(body),
            {flag}});
  world.all_reduce(flag, flag, 1, s, {.name = "over_budget_allreduce"});
  Buffer host = dev.allocate_host(sizeof(float));
  s.read_to_host(host, flag, sizeof(float), "over_budget .item()");
  // Every rank set its slot before it joined the all-reduce, which has completed: the read waits
  // for it.
  const int ranks = functional ? int(*host.as<float>()) : std::accumulate(slots, slots + n, 0);
  each_dispatcher(chunks, [](layers::TokenDispatcher& d) { d.reset_over_budget(); });
  return ranks;
}

void prepare_for_rerun(Chunks& chunks) {
  each_dispatcher(chunks, [](layers::TokenDispatcher& d) {
    d.set_sync_free(false);
    d.rewind_plans();
  });
}

void restore_budget(Chunks& chunks) {
  each_dispatcher(chunks, [](layers::TokenDispatcher& d) { d.set_sync_free(true); });
}

}  // namespace nodeemu::emu
