// The virtual timeline as it happens: an observer interface (as Taskflow's) that sees every
// device operation and every host API call with its virtual start and end, a recorder that
// writes Chrome trace JSON (Perfetto opens it), and the timeline hash.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "devices/units.hpp"

namespace nodeemu {

// Comm: one rank's part of a collective or point-to-point transfer (comm/).
enum class OpKind : std::uint8_t { Kernel, Copy, Record, Wait, Comm };

const char* to_string(OpKind k);

// What a device operation is, for reports and the trace's categories: the kernel classes that
// `nodeemu layer` splits busy time by.
enum class OpClass : std::uint8_t { Gemm, Attention, Elementwise, Permute, Memcpy, Comm, Other };

const char* to_string(OpClass c);

struct OpRecord {
  std::uint64_t id;  // issue sequence number, unique in the node
  int device;
  int track;  // track id within the device (see Timeline::track_name)
  OpKind kind;
  const std::string* name;
  VTime start, end;
  int host;                     // the host actor that issued it
  std::int64_t waits_for = -1;  // Wait ops: id of the op the event marked (a flow arrow)
  OpClass cls = OpClass::Other;
  // Comm ops: the bytes this party sends to the other members (all phases; not in the timeline
  // hash, which predates it).
  double bytes = 0;
  // Comm ops: the name of the group the operation ran on ("ep0", "dp-cp1", "pp_fwd_0_4"), as the
  // communicator named it; null for others. Valid during the observer's call (not hashed).
  const std::string* group = nullptr;
};

struct HostRecord {
  int host;
  const std::string* name;  // the API call, e.g. "launch expert_fc1"
  VTime start, end;
};

class TimelineObserver {
 public:
  virtual ~TimelineObserver() = default;
  virtual void on_op(const OpRecord& r) = 0;
  virtual void on_host(const HostRecord&) {}
};

// Names of processes and tracks, filled in by the node as devices, streams and hosts appear.
struct TimelineLayout {
  struct Track {
    int device;
    int track;
    std::string name;
  };
  std::vector<std::string> device_names;
  std::vector<Track> tracks;
  std::vector<std::string> host_names;
  std::vector<int> host_device;  // the device whose process shows the host's track, or -1
};

// Keeps every record and writes a Chrome trace: one process per device, one thread per stream
// and copy engine, a host thread per host actor, flow arrows from each event record to the waits
// on it. Times are virtual microseconds.
class TraceRecorder : public TimelineObserver {
 public:
  // Keep only these devices' operations and the calls of the hosts that drive them (and of the
  // hosts that drive none). A full-size run's trace (DeepSeek-V3: 1024 GPUs, ~90 M operations)
  // would not fit in memory nor open in a viewer; a few GPUs of it do. `layout` (the engine's,
  // which outlives the recorder's use) says which device a host drives.
  void keep_only(const std::vector<int>& devices, const TimelineLayout* layout);
  void on_op(const OpRecord& r) override;
  void on_host(const HostRecord& r) override;
  void write_chrome_json(std::ostream& os, const TimelineLayout& layout) const;
  struct Op {
    std::uint64_t id;
    int device, track;
    OpKind kind;
    std::string name;
    VTime start, end;
    int host;
    std::int64_t waits_for;
    OpClass cls;
    double bytes;  // OpRecord::bytes
  };
  struct Host {
    int host;
    std::string name;
    VTime start, end;
  };
  const std::vector<Op>& ops() const { return ops_; }
  const std::vector<Host>& host_calls() const { return host_; }

 private:
  bool kept(int device) const {
    return keep_.empty() || device < 0 ||
           (std::size_t(device) < keep_.size() && keep_[std::size_t(device)]);
  }
  std::vector<Op> ops_;
  std::vector<Host> host_;
  std::vector<char> keep_;  // by device; empty: every device
  const TimelineLayout* layout_ = nullptr;
};

// FNV-1a over every record in the order the engine produced them; equal hashes mean equal
// virtual timelines.
class TimelineHasher {
 public:
  void add(const OpRecord& r);
  void add(const HostRecord& r);
  std::uint64_t value() const { return h_; }
  std::uint64_t count() const { return n_; }

 private:
  void mix(std::uint64_t v);
  std::uint64_t h_ = 1469598103934665603ull;
  std::uint64_t n_ = 0;
};

}  // namespace nodeemu
