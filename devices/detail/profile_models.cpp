#include "devices/detail/profile_models.hpp"

#include <algorithm>

#include "devices/errors.hpp"

namespace nodeemu::detail {

std::vector<std::size_t> ProfileModels::all_rows(const CsvTable& t) {
  std::vector<std::size_t> rows(t.rows());
  for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = i;
  return rows;
}

std::vector<std::size_t> ProfileModels::all_but(const CsvTable& t, std::size_t row) {
  std::vector<std::size_t> rows;
  rows.reserve(t.rows());
  for (std::size_t i = 0; i < t.rows(); ++i)
    if (i != row) rows.push_back(i);
  return rows;
}

ProfileModels::ProfileModels(ProfileTables tables) : tables_(std::move(tables)) {
  const ProfileTables& t = tables_;
  // The floor comes first: the fp32 GEMM and attention models extrapolate down to it.
  if (t.memory_bound) {
    MemoryBoundModel::validate(*t.memory_bound);
    memory_ = std::make_unique<MemoryBoundModel>(*t.memory_bound, all_rows(*t.memory_bound));
    floor_s_ = memory_->floor_s();
  }
  if (t.memory_anatomy) {
    MemoryBoundModel::validate(*t.memory_anatomy);
    anatomy_ = std::make_unique<MemoryBoundModel>(*t.memory_anatomy, all_rows(*t.memory_anatomy),
                                                  floor_s_ > 0 ? floor_s_ : 1e-6);
  }
  if (t.gemm) {
    GemmModel::validate(*t.gemm);
    gemm_ = std::make_unique<GemmModel>(*t.gemm, all_rows(*t.gemm));
    for (std::size_t r = 0; r < t.gemm->rows(); ++r) {
      const GemmQuery q = GemmModel::query(*t.gemm, r);
      best_flops_ = std::max(best_flops_, 2 * q.m * q.n * q.k / t.gemm->number(r, "seconds"));
    }
  }
  if (t.gemm_fp32) {
    Fp32GemmModel::validate(*t.gemm_fp32);
    fp32_ = std::make_unique<Fp32GemmModel>(*t.gemm_fp32, all_rows(*t.gemm_fp32), floor_s_);
  }
  if (t.grouped_gemm) {
    GroupedGemmModel::validate(*t.grouped_gemm);
    if (!gemm_)
      throw ConfigError(t.grouped_gemm->file(), "table",
                        "a grouped GEMM table needs the GEMM table beside it (the ratios for "
                        "other shapes and passes come from it); add gemm_bf16.csv");
    grouped_ = std::make_unique<GroupedGemmModel>(*t.grouped_gemm, all_rows(*t.grouped_gemm),
                                                  *gemm_, t.grouped_tiling);
  }
  if (t.attention) {
    AttentionModel::validate(*t.attention);
    attention_ = std::make_unique<AttentionModel>(*t.attention, all_rows(*t.attention), floor_s_);
  }
  if (t.pcie) {
    PcieModel::validate(*t.pcie);
    pcie_ = std::make_unique<PcieModel>(*t.pcie, all_rows(*t.pcie));
  }
}

}  // namespace nodeemu::detail
