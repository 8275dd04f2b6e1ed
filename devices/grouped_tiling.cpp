#include "devices/grouped_tiling.hpp"

namespace nodeemu {

std::optional<GroupedTiling> GroupedTiling::torch_grouped_mm(int major, int sms) {
  if (major == 9) return GroupedTiling{128, 256, 64, 128, 128, 2, sms};
  // sm100: one tile size for every shape.
  if (major == 10) return GroupedTiling{64, 128, 64, 128, 0, 2, sms};
  return std::nullopt;
}

}  // namespace nodeemu
