#include "devices/trace.hpp"

#include <nlohmann/json.hpp>

#include <map>
#include <ostream>

#include "devices/check.hpp"

namespace nodeemu {

const char* to_string(OpKind k) {
  switch (k) {
    case OpKind::Kernel:
      return "kernel";
    case OpKind::Copy:
      return "copy";
    case OpKind::Record:
      return "record";
    case OpKind::Comm:
      return "comm";
    case OpKind::Wait:
      return "wait";
  }
  return "?";
}

const char* to_string(OpClass c) {
  switch (c) {
    case OpClass::Gemm:
      return "gemm";
    case OpClass::Attention:
      return "attention";
    case OpClass::Elementwise:
      return "elementwise";
    case OpClass::Permute:
      return "permute";
    case OpClass::Memcpy:
      return "memcpy";
    case OpClass::Comm:
      return "comm";
    case OpClass::Other:
      return "other";
  }
  return "?";
}

void TraceRecorder::keep_only(const std::vector<int>& devices, const TimelineLayout* layout) {
  keep_.clear();
  for (int d : devices) {
    NE_CHECK(d >= 0, "trace: a negative device to keep");
    if (std::size_t(d) >= keep_.size()) keep_.resize(std::size_t(d) + 1, 0);
    keep_[std::size_t(d)] = 1;
  }
  layout_ = layout;
}

void TraceRecorder::on_op(const OpRecord& r) {
  if (!kept(r.device)) return;
  ops_.push_back({r.id, r.device, r.track, r.kind, *r.name, r.start, r.end, r.host, r.waits_for,
                  r.cls, r.bytes});
}

void TraceRecorder::on_host(const HostRecord& r) {
  if (!keep_.empty() && !kept(layout_->host_device.at(std::size_t(r.host)))) return;
  host_.push_back({r.host, *r.name, r.start, r.end});
}

namespace {

using Json = nlohmann::ordered_json;

// Virtual picoseconds as Chrome's microseconds: the double nearest the exact quotient, which the
// library prints in the fewest digits that read back to it, so a trace up to about 1,000 s of
// virtual time shows every picosecond exactly (past that the last digit may round).
double us(VTime t) {
  return static_cast<double>(t) / 1e6;
}

constexpr int kHostPid = 1000000;  // hosts without a device get their own process
constexpr int kHostTidBase = 100000;

// Events go out one at a time, each built and written by the JSON library: a long run's trace
// holds millions, and a whole document in memory would cost several times the recorder's own.
class EventWriter {
 public:
  explicit EventWriter(std::ostream& os) : os_(os) {
    os_ << "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n";
  }
  ~EventWriter() { os_ << "\n]}\n"; }
  void operator()(const Json& e) {
    if (!first_) os_ << ",\n";
    first_ = false;
    os_ << e.dump(-1, ' ', false, Json::error_handler_t::replace);
  }

 private:
  std::ostream& os_;
  bool first_ = true;
};

Json metadata(const char* name, int pid, Json args) {
  return Json{{"ph", "M"}, {"name", name}, {"pid", pid}, {"args", std::move(args)}};
}

}  // namespace

void TraceRecorder::write_chrome_json(std::ostream& os, const TimelineLayout& layout) const {
  EventWriter put(os);
  for (size_t d = 0; d < layout.device_names.size(); ++d) {
    if (!kept(int(d))) continue;
    put(metadata("process_name", int(d), {{"name", layout.device_names[d]}}));
    put(metadata("process_sort_index", int(d), {{"sort_index", d}}));
  }
  for (auto& t : layout.tracks) {
    if (!kept(t.device)) continue;
    Json e = metadata("thread_name", t.device, {{"name", t.name}});
    e["tid"] = t.track;
    put(e);
  }
  bool any_free_host = false;
  for (size_t h = 0; h < layout.host_names.size(); ++h) {
    if (!kept(layout.host_device[h])) continue;
    const int pid = layout.host_device[h] >= 0 ? layout.host_device[h] : kHostPid;
    any_free_host |= pid == kHostPid;
    Json e = metadata("thread_name", pid, {{"name", "host " + layout.host_names[h]}});
    e["tid"] = kHostTidBase + static_cast<int>(h);
    put(e);
  }
  if (any_free_host) put(metadata("process_name", kHostPid, {{"name", "host"}}));
  std::map<std::uint64_t, const Op*> by_id;
  for (auto& o : ops_) by_id[o.id] = &o;
  for (auto& o : ops_) {
    Json args{{"op", o.id}, {"host", o.host}, {"class", to_string(o.cls)}};
    if (o.bytes > 0) args["bytes"] = static_cast<std::uint64_t>(o.bytes);
    put(Json{{"ph", "X"},
             {"cat", to_string(o.kind)},
             {"name", o.name},
             {"pid", o.device},
             {"tid", o.track},
             {"ts", us(o.start)},
             {"dur", us(o.end - o.start)},
             {"args", std::move(args)}});
    if (o.kind != OpKind::Wait || o.waits_for < 0) continue;
    auto it = by_id.find(static_cast<std::uint64_t>(o.waits_for));
    if (it == by_id.end()) continue;
    // A flow arrow from the recorded event to the wait that consumed it.
    const Op& src = *it->second;
    put(Json{{"ph", "s"},
             {"cat", "event"},
             {"name", "event"},
             {"id", o.id},
             {"pid", src.device},
             {"tid", src.track},
             {"ts", us(src.end)}});
    put(Json{{"ph", "f"},
             {"bp", "e"},
             {"cat", "event"},
             {"name", "event"},
             {"id", o.id},
             {"pid", o.device},
             {"tid", o.track},
             {"ts", us(o.end)}});
  }
  for (auto& h : host_) {
    const int dev = layout.host_device[static_cast<size_t>(h.host)];
    put(Json{{"ph", "X"},
             {"cat", "host"},
             {"name", h.name},
             {"pid", dev >= 0 ? dev : kHostPid},
             {"tid", kHostTidBase + h.host},
             {"ts", us(h.start)},
             {"dur", us(h.end - h.start)}});
  }
}

void TimelineHasher::mix(std::uint64_t v) {
  // FNV-1a over 64-bit words with a final avalanche per word: one multiply per field keeps the
  // hash off the engine's profile.
  h_ = (h_ ^ v) * 1099511628211ull;
  h_ ^= h_ >> 29;
}

void TimelineHasher::add(const OpRecord& r) {
  mix(r.id);
  mix(static_cast<std::uint64_t>(r.device) << 32 | static_cast<std::uint32_t>(r.track));
  mix(static_cast<std::uint64_t>(r.kind));
  mix(static_cast<std::uint64_t>(r.start));
  mix(static_cast<std::uint64_t>(r.end));
  std::uint64_t w = 0;
  int k = 0;
  for (char c : *r.name) {
    w = (w << 8) | static_cast<unsigned char>(c);
    if (++k == 8) mix(w), w = 0, k = 0;
  }
  mix(w ^ (static_cast<std::uint64_t>(r.name->size()) << 56));
  ++n_;
}

void TimelineHasher::add(const HostRecord& r) {
  mix(0xb0b0b0b0ull ^ static_cast<std::uint64_t>(r.host));
  mix(static_cast<std::uint64_t>(r.start));
  mix(static_cast<std::uint64_t>(r.end));
  ++n_;
}

}  // namespace nodeemu
