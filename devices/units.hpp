// Virtual time and byte formatting shared by the whole emulator.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace nodeemu {

// Virtual time is an integer count of picoseconds: exact ordering and hashing, no drift from
// summing doubles, and 2^63 ps is over 100 days of emulated time.
using VTime = std::int64_t;
inline constexpr VTime kPicosPerSecond = 1'000'000'000'000;
inline constexpr VTime kVTimeInfinity = INT64_MAX;

inline VTime seconds_to_vtime(double s) {
  // Round up so that no non-empty operation takes zero time.
  double ps = s * 1e12;
  auto t = static_cast<VTime>(ps);
  return (static_cast<double>(t) < ps) ? t + 1 : t;
}
inline double vtime_to_seconds(VTime t) {
  return static_cast<double>(t) * 1e-12;
}
inline double vtime_to_us(VTime t) {
  return static_cast<double>(t) * 1e-6;
}

inline std::string format_bytes(std::uint64_t b) {
  char buf[64];
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024.0 && u < 4) v /= 1024.0, ++u;
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(b));
  else
    std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  return buf;
}

}  // namespace nodeemu
