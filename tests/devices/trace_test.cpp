// The trace recorder (devices/trace.hpp): a trace kept to a few devices holds their operations,
// their hosts' calls and their tracks only, and its flow arrows never point at what it left out.
#include "devices/trace.hpp"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>

namespace nodeemu {
namespace {

const std::string kKernel = "gemm", kRecord = "record", kWait = "wait", kLaunch = "launch gemm";

TimelineLayout three_devices() {
  TimelineLayout l;
  l.device_names = {"GPU 0", "GPU 1", "GPU 2"};
  for (int d = 0; d < 3; ++d) l.tracks.push_back({d, 0, "compute"});
  l.host_names = {"rank 0", "rank 1", "rank 2", "main"};
  l.host_device = {0, 1, 2, -1};
  return l;
}

// Device 0 records an event that device 1 waits on; every host calls once.
void feed(TraceRecorder& t) {
  for (int d = 0; d < 3; ++d) {
    t.on_op(OpRecord{.id = std::uint64_t(10 * d),
                     .device = d,
                     .track = 0,
                     .kind = OpKind::Kernel,
                     .name = &kKernel,
                     .start = 0,
                     .end = 5,
                     .host = d});
    t.on_host(HostRecord{.host = d, .name = &kLaunch, .start = 0, .end = 1});
  }
  t.on_op(OpRecord{.id = 1,
                   .device = 0,
                   .track = 0,
                   .kind = OpKind::Record,
                   .name = &kRecord,
                   .start = 5,
                   .end = 5,
                   .host = 0});
  t.on_op(OpRecord{.id = 11,
                   .device = 1,
                   .track = 0,
                   .kind = OpKind::Wait,
                   .name = &kWait,
                   .start = 5,
                   .end = 6,
                   .host = 1,
                   .waits_for = 1});
  t.on_host(HostRecord{.host = 3, .name = &kLaunch, .start = 0, .end = 1});
}

std::set<int> pids(const TraceRecorder& t, const TimelineLayout& l, int* flows) {
  std::ostringstream os;
  t.write_chrome_json(os, l);
  std::set<int> out;
  *flows = 0;
  const auto json = nlohmann::json::parse(os.str());
  for (const auto& e : json["traceEvents"]) {
    out.insert(e["pid"].get<int>());
    *flows += e["ph"] == "s";
  }
  return out;
}

TEST(TraceRecorder, KeepsEveryDeviceUnlessToldOtherwise) {
  const TimelineLayout l = three_devices();
  TraceRecorder t;
  feed(t);
  EXPECT_EQ(t.ops().size(), 5u);
  EXPECT_EQ(t.host_calls().size(), 4u);
  int flows = 0;
  EXPECT_EQ(pids(t, l, &flows), (std::set<int>{0, 1, 2, 1000000}));
  EXPECT_EQ(flows, 1);
}

TEST(TraceRecorder, KeptToSomeDevicesHoldsTheirRecordsOnly) {
  const TimelineLayout l = three_devices();
  TraceRecorder t;
  t.keep_only({1, 2}, &l);
  feed(t);
  EXPECT_EQ(t.ops().size(), 3u);         // device 1's kernel and wait, device 2's kernel
  EXPECT_EQ(t.host_calls().size(), 3u);  // ranks 1 and 2, and the main program
  for (const auto& o : t.ops()) EXPECT_NE(o.device, 0);
  int flows = 0;
  // Device 0's process is not in it, not even as a name; the wait's event was recorded on
  // device 0, so it has no arrow.
  EXPECT_EQ(pids(t, l, &flows), (std::set<int>{1, 2, 1000000}));
  EXPECT_EQ(flows, 0);
}

}  // namespace
}  // namespace nodeemu
