#include "devices/grouped_tiling.hpp"

namespace nodeemu {

const std::array<GroupedTiling::Field, 6>& GroupedTiling::fields() {
  static const std::array<Field, 6> f = {{
      {"tile_rows", &GroupedTiling::tile_rows, "rows of the grouped kernel's output tile", 1},
      {"tile_cols", &GroupedTiling::tile_cols, "columns of its output tile", 1},
      {"small_tile_rows", &GroupedTiling::small_tile_rows, "rows of the tile for small groups", 1},
      {"small_tile_cols", &GroupedTiling::small_tile_cols, "columns of the tile for small groups",
       1},
      {"small_at_most", &GroupedTiling::small_at_most,
       "rows per group or n at or below which the small tile runs", 0},
      {"cluster_rows", &GroupedTiling::cluster_rows, "CTAs per cluster along the rows", 1},
  }};
  return f;
}

std::optional<GroupedTiling> GroupedTiling::torch_grouped_mm(int major, int sms) {
  if (major == 9) return GroupedTiling{128, 256, 64, 128, 128, 2, sms};
  // sm100: one tile size for every shape.
  if (major == 10) return GroupedTiling{64, 128, 64, 128, 0, 2, sms};
  return std::nullopt;
}

}  // namespace nodeemu
