#include "devices/trace.hpp"

#include <map>
#include <ostream>

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

void TraceRecorder::on_op(const OpRecord& r) {
  ops_.push_back({r.id, r.device, r.track, r.kind, *r.name, r.start, r.end, r.host, r.waits_for,
                  r.cls, r.bytes});
}

void TraceRecorder::on_host(const HostRecord& r) {
  host_.push_back({r.host, *r.name, r.start, r.end});
}

namespace {

void json_string(std::ostream& os, const std::string& s) {
  os << '"';
  for (char c : s) {
    switch (c) {
      case '"':
        os << "\\\"";
        break;
      case '\\':
        os << "\\\\";
        break;
      case '\n':
        os << "\\n";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          os << buf;
        } else {
          os << c;
        }
    }
  }
  os << '"';
}

// Virtual picoseconds as Chrome's microseconds, printed exactly (no float rounding).
void us(std::ostream& os, VTime t) {
  os << t / 1000000;
  VTime frac = t % 1000000;
  if (frac) {
    char buf[16];
    std::snprintf(buf, sizeof buf, ".%06lld", static_cast<long long>(frac));
    os << buf;
  }
}

constexpr int kHostPid = 1000000;  // hosts without a device get their own process
constexpr int kHostTidBase = 100000;

}  // namespace

void TraceRecorder::write_chrome_json(std::ostream& os, const TimelineLayout& layout) const {
  os << "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n";
  bool first = true;
  auto sep = [&] {
    if (!first) os << ",\n";
    first = false;
  };
  for (size_t d = 0; d < layout.device_names.size(); ++d) {
    sep();
    os << "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":" << d << ",\"args\":{\"name\":";
    json_string(os, layout.device_names[d]);
    os << "}}";
    sep();
    os << "{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":" << d
       << ",\"args\":{\"sort_index\":" << d << "}}";
  }
  for (auto& t : layout.tracks) {
    sep();
    os << "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":" << t.device << ",\"tid\":" << t.track
       << ",\"args\":{\"name\":";
    json_string(os, t.name);
    os << "}}";
  }
  bool any_free_host = false;
  for (size_t h = 0; h < layout.host_names.size(); ++h) {
    int pid = layout.host_device[h] >= 0 ? layout.host_device[h] : kHostPid;
    any_free_host |= pid == kHostPid;
    sep();
    os << "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":" << pid
       << ",\"tid\":" << kHostTidBase + static_cast<int>(h) << ",\"args\":{\"name\":";
    json_string(os, "host " + layout.host_names[h]);
    os << "}}";
  }
  if (any_free_host) {
    sep();
    os << "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":" << kHostPid
       << ",\"args\":{\"name\":\"host\"}}";
  }
  std::map<std::uint64_t, const Op*> by_id;
  for (auto& o : ops_) by_id[o.id] = &o;
  for (auto& o : ops_) {
    sep();
    os << "{\"ph\":\"X\",\"cat\":\"" << to_string(o.kind) << "\",\"name\":";
    json_string(os, o.name);
    os << ",\"pid\":" << o.device << ",\"tid\":" << o.track << ",\"ts\":";
    us(os, o.start);
    os << ",\"dur\":";
    us(os, o.end - o.start);
    os << ",\"args\":{\"op\":" << o.id << ",\"host\":" << o.host << ",\"class\":\""
       << to_string(o.cls) << "\"";
    if (o.bytes > 0) os << ",\"bytes\":" << static_cast<std::uint64_t>(o.bytes);
    os << "}}";
    if (o.kind == OpKind::Wait && o.waits_for >= 0) {
      auto it = by_id.find(static_cast<std::uint64_t>(o.waits_for));
      if (it != by_id.end()) {
        const Op& src = *it->second;
        sep();
        os << "{\"ph\":\"s\",\"cat\":\"event\",\"name\":\"event\",\"id\":" << o.id
           << ",\"pid\":" << src.device << ",\"tid\":" << src.track << ",\"ts\":";
        us(os, src.end);
        os << "}";
        sep();
        os << "{\"ph\":\"f\",\"bp\":\"e\",\"cat\":\"event\",\"name\":\"event\",\"id\":" << o.id
           << ",\"pid\":" << o.device << ",\"tid\":" << o.track << ",\"ts\":";
        us(os, o.end);
        os << "}";
      }
    }
  }
  for (auto& h : host_) {
    int dev = layout.host_device[static_cast<size_t>(h.host)];
    sep();
    os << "{\"ph\":\"X\",\"cat\":\"host\",\"name\":";
    json_string(os, h.name);
    os << ",\"pid\":" << (dev >= 0 ? dev : kHostPid) << ",\"tid\":" << kHostTidBase + h.host
       << ",\"ts\":";
    us(os, h.start);
    os << ",\"dur\":";
    us(os, h.end - h.start);
    os << "}";
  }
  os << "\n]}\n";
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
