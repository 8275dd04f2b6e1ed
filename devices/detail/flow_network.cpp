#include "devices/detail/flow_network.hpp"

#include <algorithm>
#include <cmath>

#include "devices/check.hpp"

namespace nodeemu::detail {

int FlowNetwork::add_link(std::string name, double bytes_per_s, std::vector<int> hbm_devices) {
  NE_CHECK(bytes_per_s > 0, "a link needs a positive bandwidth");
  for (int d : hbm_devices) {
    NE_CHECK(d >= 0, "a link's HBM device is a device index");
    if (static_cast<std::size_t>(d) >= hbm_traffic_.size()) {
      hbm_traffic_.resize(static_cast<std::size_t>(d) + 1, 0.0);
      hbm_next_.resize(static_cast<std::size_t>(d) + 1, 0.0);
      hbm_seen_.resize(static_cast<std::size_t>(d) + 1, 0);
    }
  }
  links_.push_back({std::move(name), bytes_per_s / static_cast<double>(kPicosPerSecond),
                    std::move(hbm_devices)});
  local_of_link_.push_back(-1);
  link_mark_.push_back(0);
  return static_cast<int>(links_.size()) - 1;
}

double FlowNetwork::hbm_traffic(int device) const {
  const auto d = static_cast<std::size_t>(device);
  return d < hbm_traffic_.size() ? hbm_traffic_[d] : 0.0;
}

void FlowNetwork::account_hbm() {
  // Only the devices some flow touches, now or at the last accounting, are looked at: like the
  // re-share, this stays independent of the fabric's size.
  // Each device once in the scratch (its stamp says whether this accounting has it), so the
  // sort below orders the distinct devices, not one entry per flow and link.
  hbm_scratch_.clear();
  ++hbm_epoch_;
  const auto visit = [&](int d) {
    std::uint64_t& seen = hbm_seen_[static_cast<std::size_t>(d)];
    if (seen != hbm_epoch_) seen = hbm_epoch_, hbm_scratch_.push_back(d);
  };
  for (const Flow& f : flows_)
    for (auto& [link, c] : f.coef) {
      const Link& l = links_[static_cast<std::size_t>(link)];
      if (l.hbm_devices.empty()) continue;
      const double each = f.rate * c / static_cast<double>(l.hbm_devices.size());
      for (int d : l.hbm_devices) {
        hbm_next_[static_cast<std::size_t>(d)] += each;
        visit(d);
      }
    }
  for (int d : hbm_touched_) visit(d);
  std::sort(hbm_scratch_.begin(), hbm_scratch_.end());
  hbm_changed_.clear();
  hbm_touched_.clear();
  for (int d : hbm_scratch_) {
    const auto i = static_cast<std::size_t>(d);
    if (hbm_next_[i] != hbm_traffic_[i]) hbm_changed_.push_back(d);
    hbm_traffic_[i] = hbm_next_[i];
    hbm_next_[i] = 0;
    if (hbm_traffic_[i] > 0) hbm_touched_.push_back(d);
  }
}

bool FlowNetwork::start(FlowId id, std::vector<LinkLoad> loads, VTime now) {
  // Sum the parties' loads per link, in link order so that the arithmetic is always the same.
  std::sort(loads.begin(), loads.end(),
            [](const LinkLoad& a, const LinkLoad& b) { return a.link < b.link; });
  Flow f{id, {}, 0, 0, now, 0};
  for (const LinkLoad& l : loads) {
    NE_CHECK(l.link >= 0 && l.link < link_count() && l.bytes >= 0, "bad link load");
    if (l.bytes <= 0) continue;
    if (!f.coef.empty() && f.coef.back().first == l.link) {
      f.coef.back().second += l.bytes;
    } else {
      f.coef.push_back({l.link, l.bytes});
    }
  }
  double most = 0;
  for (auto& [link, bytes] : f.coef) most = std::max(most, bytes);
  completions_.clear();
  if (most <= 0) {
    hbm_changed_.clear();
    return false;
  }
  for (auto& c : f.coef) c.second /= most;
  f.remaining = most;
  flows_.push_back(std::move(f));
  reshare(now, flows_.back().coef);
  return true;
}

bool FlowNetwork::current(FlowId id, std::uint32_t version) const {
  for (const Flow& f : flows_)
    if (f.id == id) return f.version == version;
  return false;
}

void FlowNetwork::finish(FlowId id, VTime now) {
  auto it = std::find_if(flows_.begin(), flows_.end(), [&](const Flow& f) { return f.id == id; });
  NE_CHECK(it != flows_.end(), "a flow finished that was not flowing");
  const std::vector<std::pair<int, double>> freed = std::move(it->coef);
  flows_.erase(it);
  completions_.clear();
  if (!flows_.empty())
    reshare(now, freed);
  else
    account_hbm();
}

void FlowNetwork::mark_affected(const std::vector<std::pair<int, double>>& changed) {
  // The flows linked to the changed links through shared links, transitively: the component of
  // the sharing graph a start or finish touches. Max-min fairness is decided per component (a
  // flow's rate depends only on the links it crosses and the flows on them), so the others
  // keep their rates and completions.
  ++link_epoch_;
  for (auto& [link, c] : changed) link_mark_[static_cast<std::size_t>(link)] = link_epoch_;
  affected_.assign(flows_.size(), 0);
  for (bool grew = true; grew;) {
    grew = false;
    for (std::size_t f = 0; f < flows_.size(); ++f) {
      if (affected_[f]) continue;
      const auto& coef = flows_[f].coef;
      const bool touches = std::any_of(coef.begin(), coef.end(), [&](const auto& lc) {
        return link_mark_[static_cast<std::size_t>(lc.first)] == link_epoch_;
      });
      if (!touches) continue;
      affected_[f] = 1;
      grew = true;
      for (auto& [link, c] : coef) link_mark_[static_cast<std::size_t>(link)] = link_epoch_;
    }
  }
}

void FlowNetwork::reshare(VTime now, const std::vector<std::pair<int, double>>& changed) {
  mark_affected(changed);
  sharing_.clear();
  for (std::size_t f = 0; f < flows_.size(); ++f)
    if (affected_[f]) sharing_.push_back(&flows_[f]);
  for (Flow* f : sharing_) {
    f->remaining -= static_cast<double>(now - f->last_update) * f->rate;
    if (f->remaining < 0) f->remaining = 0;
    f->last_update = now;
  }
  // Only the links some flow crosses take part: a link nobody loads never fills and never
  // freezes a flow, so leaving it out changes no rate (and keeps a re-share independent of the
  // fabric's size: thousands of links at 1,024 GPUs).
  used_links_.clear();
  for (const Flow* f : sharing_)
    for (auto& [link, c] : f->coef)
      if (local_of_link_[static_cast<std::size_t>(link)] < 0) {
        local_of_link_[static_cast<std::size_t>(link)] = static_cast<int>(used_links_.size());
        used_links_.push_back(link);
      }
  auto local = [&](int link) {
    return static_cast<std::size_t>(local_of_link_[static_cast<std::size_t>(link)]);
  };
  // Max-min fairness by progressive filling: raise every unfrozen flow's rate together until a
  // link fills, freeze the flows through it, repeat.
  const std::size_t n = sharing_.size(), m = used_links_.size();
  std::vector<double> x(n, 0), residual(m), demand(m);
  std::vector<char> frozen(n, 0);
  for (std::size_t l = 0; l < m; ++l)
    residual[l] = links_[static_cast<std::size_t>(used_links_[l])].bytes_per_ps;
  for (std::size_t left = n; left > 0;) {
    std::fill(demand.begin(), demand.end(), 0.0);
    for (std::size_t f = 0; f < n; ++f)
      if (!frozen[f])
        for (auto& [link, c] : sharing_[f]->coef) demand[local(link)] += c;
    double delta = INFINITY;
    for (std::size_t l = 0; l < m; ++l)
      if (demand[l] > 0) delta = std::min(delta, residual[l] / demand[l]);
    NE_CHECK(std::isfinite(delta), "a flow without links is flowing");
    for (std::size_t l = 0; l < m; ++l) residual[l] -= delta * demand[l];
    for (std::size_t f = 0; f < n; ++f) {
      if (frozen[f]) continue;
      x[f] += delta;
      for (auto& [link, c] : sharing_[f]->coef) {
        const std::size_t g = static_cast<std::size_t>(link);
        if (residual[local(link)] <= 1e-9 * links_[g].bytes_per_ps) {
          frozen[f] = 1;
          --left;
          break;
        }
      }
    }
  }
  for (int link : used_links_) local_of_link_[static_cast<std::size_t>(link)] = -1;
  completions_.clear();
  for (std::size_t f = 0; f < n; ++f) {
    Flow& flow = *sharing_[f];
    flow.rate = x[f];
    ++flow.version;
    const double left = std::ceil(flow.remaining / flow.rate);
    completions_.push_back({flow.id, now + static_cast<VTime>(left), flow.version});
  }
  account_hbm();
}

}  // namespace nodeemu::detail
