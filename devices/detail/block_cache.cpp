#include "devices/detail/block_cache.hpp"

#include <algorithm>
#include <bit>

#include "devices/check.hpp"

namespace nodeemu::numa::detail {

std::size_t capacity_for(std::size_t bytes, std::size_t page) {
  const std::size_t pages = (bytes + page - 1) / page;
  if (pages <= 16) return pages * page;
  // An eighth of the largest power of two not above it: at most 12.5 % more than asked.
  const std::size_t step = std::bit_floor(pages) / 8;
  return (pages + step - 1) / step * step * page;
}

BlockCache::BlockCache(std::size_t cap_bytes, std::function<void(const Placement&)> release)
    : cap_(cap_bytes), release_(std::move(release)) {}

bool BlockCache::take(int node, std::size_t capacity, Placement& out) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_key_.lower_bound({node, capacity});
  while (it != by_key_.end() && it->first.first == node && it->first.second < 2 * capacity &&
         it->second.empty())
    ++it;
  if (it == by_key_.end() || it->first.first != node || it->first.second >= 2 * capacity)
    return false;
  // The newest: the likeliest to be still in the cache hierarchy.
  out = *it->second.back();
  oldest_first_.erase(it->second.back());
  it->second.pop_back();
  cached_ -= out.capacity;
  in_use_ += out.capacity;
  in_use_peak_ = std::max(in_use_peak_, in_use_);
  return true;
}

std::size_t BlockCache::budget() const {
  return std::max(cap_, in_use_peak_ > in_use_ ? in_use_peak_ - in_use_ : 0);
}

void BlockCache::make_room(std::size_t incoming, std::vector<Placement>& victims) {
  while (!oldest_first_.empty() && cached_ + incoming > budget()) {
    const Placement& victim = oldest_first_.front();
    auto& same = by_key_[{victim.requested_node, victim.capacity}];
    // Its key's list is oldest first too, so the victim is at its front.
    NE_CHECK(!same.empty() && &*same.front() == &victim, "the block cache's lists disagree");
    same.erase(same.begin());
    cached_ -= victim.capacity;
    victims.push_back(victim);
    oldest_first_.pop_front();
  }
}

void BlockCache::mapped(std::size_t capacity) {
  std::vector<Placement> victims;
  {
    std::lock_guard<std::mutex> lock(mu_);
    in_use_ += capacity;
    in_use_peak_ = std::max(in_use_peak_, in_use_);
    make_room(0, victims);
  }
  for (const Placement& v : victims) release_(v);
}

void BlockCache::unmapped(std::size_t capacity) {
  std::lock_guard<std::mutex> lock(mu_);
  in_use_ -= std::min(in_use_, capacity);
}

bool BlockCache::keep(const Placement& p) {
  std::vector<Placement> victims;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const std::size_t was_in_use = in_use_;
    in_use_ -= std::min(in_use_, p.capacity);
    if (p.capacity > budget()) {
      in_use_ = was_in_use;
      return false;
    }
    make_room(p.capacity, victims);
    oldest_first_.push_back(p);
    by_key_[{p.requested_node, p.capacity}].push_back(std::prev(oldest_first_.end()));
    cached_ += p.capacity;
    peak_ = std::max(peak_, cached_);
  }
  for (const Placement& v : victims) release_(v);
  return true;
}

std::size_t BlockCache::cached_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cached_;
}

std::size_t BlockCache::peak_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peak_;
}

void BlockCache::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  peak_ = cached_;
}

}  // namespace nodeemu::numa::detail
