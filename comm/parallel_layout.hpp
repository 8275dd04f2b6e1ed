// Megatron-Core process groups computed from a parallel layout (tp, cp, ep, etp, pp and the rank
// order), so that an emulated node forms exactly the groups that
// megatron.core.parallel_state.initialize_model_parallel would form on a real one.
//
// Megatron builds two rank generators over the same world: an attention ("decoder") one with
// sizes tp, cp, dp, pp (ep = 1) and an expert one with sizes etp, ep, edp, pp (cp = 1). Both use
// the same order string, whose first name varies fastest. Attention and expert layers may
// therefore fold the same ranks differently ("parallel folding"): with world 8, tp 2, ep 4,
// etp 1 the attention dp is 4 while the expert layers see ep 4 x edp 2.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace nodeemu {

struct ParallelLayout {
  int world = 1;  // total ranks (emulated GPUs)
  int tp = 1, cp = 1, ep = 1, pp = 1;
  // Expert tensor parallel size. 0 means unset, which Megatron resolves to tp.
  int etp = 0;
  // Megatron's default rank order; the first name varies fastest. Names whose size is 1 in both
  // generators may be left out (Megatron appends them).
  std::string order = "tp-cp-ep-dp-pp";

  int expert_tp() const { return etp == 0 ? tp : etp; }
  // Attention data parallel size: world / (tp * cp * pp); 0 when the sizes are not positive.
  int dp() const;
  // Expert data parallel size: world / (etp * ep * pp); 0 when the sizes are not positive.
  int edp() const;

  // Throws ConfigError("parallel layout", key, ...) naming the Megatron-Bridge key to change
  // (tensor_model_parallel_size, context_parallel_size, expert_model_parallel_size,
  // pipeline_model_parallel_size, expert_tensor_parallel_size, order, or world) when a size is
  // below 1, a product of sizes does not divide the world, or the order string is not usable.
  void validate() const;
};

enum class GroupKind {
  TP,     // attention "tp"
  CP,     // attention "cp"
  DP,     // attention "dp"
  DP_CP,  // attention "dp-cp": the gradient reduction group of non-expert weights
  PP,     // attention "pp" (Megatron requires the expert generator to agree)
  TP_CP,  // attention "tp-cp"
  EP,     // expert "ep"
  ETP,    // expert "tp"
  EDP,    // expert "dp": the gradient reduction group of expert weights
  TP_EP,  // expert "tp-ep": Megatron's expert tensor-and-model parallel group
  MP,     // attention "tp-pp": Megatron's model parallel group
};
inline constexpr int kGroupKindCount = 11;

// "tp", "cp", "dp", "dp-cp", "pp", "tp-cp", "ep", "etp", "edp", "tp-ep", "mp".
std::string_view to_string(GroupKind k);

class ProcessGroups {
 public:
  explicit ProcessGroups(ParallelLayout layout);  // validates
  const ParallelLayout& layout() const { return layout_; }

  // All groups of a kind, each a list of global ranks in group order (Megatron's order).
  const std::vector<std::vector<int>>& groups(GroupKind k) const;
  // The group of kind k that contains `rank`. Throws UsageError for a rank outside the world.
  const std::vector<int>& group_of(GroupKind k, int rank) const;
  // Index of `rank` inside group_of(k, rank): Megatron's get_*_rank().
  int rank_in(GroupKind k, int rank) const;
  // Which of groups(k) holds `rank`.
  int group_index(GroupKind k, int rank) const;
  // One line, e.g. "rank 5: tp 1/2 cp 0/1 dp 2/4 pp 0/1 | etp 0/1 ep 1/4 edp 1/2".
  std::string describe(int rank) const;

 private:
  struct Kind {
    std::vector<std::vector<int>> groups;
    std::vector<int> group_of_rank;  // index into groups, per global rank
    std::vector<int> index_in_group;
  };
  const Kind& kind(GroupKind k, int rank) const;

  ParallelLayout layout_;
  std::vector<Kind> kinds_;  // indexed by GroupKind
};

// Groups of ranks over a grid of `sizes` (first dimension fastest) in which exactly the masked
// dimensions vary: inside a group the first masked dimension is fastest, and the groups are
// ordered by the unmasked dimensions' combined index, first unmasked fastest. This is the rule of
// Megatron's generate_masked_orthogonal_rank_groups. Throws UsageError when the lengths differ or
// a size is below 1.
std::vector<std::vector<int>> orthogonal_groups(const std::vector<int>& sizes,
                                                const std::vector<bool>& mask);

}  // namespace nodeemu
