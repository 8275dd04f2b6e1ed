// How a grouped GEMM kernel tiles its output: what a profile's `grouped_gemm_tiling` says, so that
// the grouped table's times can be read as waves of tiles (devices/detail/grouped_gemm_model.hpp).
#pragma once

#include <array>
#include <optional>
#include <utility>

namespace nodeemu {

// A group's rows are cut into row tiles, rounded up to whole clusters (a cluster's CTAs share a
// column tile's weights, so a lone row tile still occupies a cluster), its n columns into column
// tiles; the small tile runs where the rows per group or n are at most `small_at_most`. A
// persistent kernel runs the tiles of all groups in waves of one per SM.
struct GroupedTiling {
  int tile_rows = 0, tile_cols = 0;
  int small_tile_rows = 0, small_tile_cols = 0;
  int small_at_most = 0;
  int cluster_rows = 1;
  int sms = 0;  // of the GPU the table was measured on: a wave's width (the profile's `sms`)

  // (rows, columns) of the tile that runs.
  std::pair<int, int> tile(bool small) const {
    return small ? std::pair{small_tile_rows, small_tile_cols} : std::pair{tile_rows, tile_cols};
  }
  bool operator==(const GroupedTiling&) const = default;

  // The profile.yaml keys (all but `sms`), with their meaning and least value: one list for the
  // schema, the loader and `nodeemu calibrate`'s writer.
  struct Field {
    const char* key;
    int GroupedTiling::*member;
    const char* help;
    int least;
  };
  static const std::array<Field, 6>& fields();

  // torch._grouped_mm's tiling on a GPU of compute capability `major`.x with `sms` SMs, or none
  // where PyTorch has no such kernel there. From PyTorch's aten/src/ATen/native/cuda/GroupMM.cu:
  // dispatch_bf16_grouped_kernel_on_tile_size picks 64x128 tiles on sm100, and on sm90 128x256
  // ones, or 64x128 where the rows per group (total rows / groups, an integer division) or n are
  // at most 128; bf16bf16_grouped_gemm_impl_sm90_sm100 uses 2x1x1 clusters.
  static std::optional<GroupedTiling> torch_grouped_mm(int major, int sms);
};

}  // namespace nodeemu
