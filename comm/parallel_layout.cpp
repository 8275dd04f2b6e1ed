#include "comm/parallel_layout.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdint>
#include <utility>

#include "devices/errors.hpp"

namespace nodeemu {
namespace {

constexpr const char* kFile = "parallel layout";

// The five parallel dimensions Megatron's RankGenerator knows, in the order of its name-to-size
// table. When the order string leaves a name out, Megatron appends it in this order, so a
// completed order string matches Megatron's even though the sizes involved are 1.
constexpr std::array<std::string_view, 5> kNames = {"tp", "pp", "dp", "ep", "cp"};

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::vector<std::string> split_dashes(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == '-') {
      out.push_back(std::move(cur));
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(std::move(cur));
  return out;
}

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

// "1, 2, 3, 6": what a user may set a size to so that it divides n.
std::string divisors_of(std::int64_t n) {
  std::vector<std::string> d;
  for (std::int64_t i = 1; i <= n && d.size() < 24; ++i) {
    if (n % i == 0) d.push_back(std::to_string(i));
  }
  return join(d, ", ");
}

// The sizes one generator sees, by name.
struct GeneratorSizes {
  int tp = 1, cp = 1, ep = 1, dp = 1, pp = 1;
  int of(std::string_view name) const {
    if (name == "tp") return tp;
    if (name == "cp") return cp;
    if (name == "ep") return ep;
    if (name == "dp") return dp;
    return pp;
  }
};

GeneratorSizes attention_sizes(const ParallelLayout& l) {
  return GeneratorSizes{l.tp, l.cp, 1, l.dp(), l.pp};
}
GeneratorSizes expert_sizes(const ParallelLayout& l) {
  return GeneratorSizes{l.expert_tp(), 1, l.ep, l.edp(), l.pp};
}

// The user's order string as a list of names, lower-cased as Megatron does. Megatron itself only
// fails on an unknown name with a KeyError and silently builds wrong groups from a repeated one,
// so both are configuration errors here.
std::vector<std::string> parse_order(const std::string& order) {
  const std::string what_to_set =
      "; set a dash-separated permutation of tp, cp, ep, dp, pp such as the default "
      "tp-cp-ep-dp-pp";
  std::vector<std::string> names = split_dashes(lower(order));
  std::vector<std::string> seen;
  for (const std::string& n : names) {
    if (n.empty())
      throw ConfigError(kFile, "order", "'" + order + "' has an empty name" + what_to_set);
    if (std::find(kNames.begin(), kNames.end(), n) == kNames.end()) {
      throw ConfigError(
          kFile, "order",
          "'" + order + "' names '" + n + "', which is not a parallel dimension" + what_to_set);
    }
    if (std::find(seen.begin(), seen.end(), n) != seen.end()) {
      throw ConfigError(kFile, "order", "'" + order + "' names '" + n + "' twice" + what_to_set);
    }
    seen.push_back(n);
  }
  return names;
}

// One of Megatron's RankGenerators: the completed order and the size of each name in it.
struct Generator {
  std::vector<std::string> order;
  std::vector<int> sizes;  // in order

  Generator(std::vector<std::string> names, const GeneratorSizes& s) : order(std::move(names)) {
    for (std::string_view n : kNames) {
      if (std::find(order.begin(), order.end(), n) == order.end()) order.emplace_back(n);
    }
    for (const std::string& n : order) sizes.push_back(s.of(n));
  }

  // Megatron's get_ranks(token): the mask follows the order string, not the token, so "dp-cp"
  // and "cp-dp" give the same groups.
  std::vector<std::vector<int>> ranks(const std::vector<std::string_view>& tokens) const {
    std::vector<bool> mask(order.size(), false);
    for (std::string_view t : tokens) {
      mask[std::find(order.begin(), order.end(), t) - order.begin()] = true;
    }
    return orthogonal_groups(sizes, mask);
  }
};

void check_positive(const char* key, int v, const std::string& hint) {
  if (v < 1) {
    throw ConfigError(kFile, key, "must be at least 1, got " + std::to_string(v) + hint);
  }
}

}  // namespace

int ParallelLayout::dp() const {
  const std::int64_t model = std::int64_t{tp} * cp * pp;
  return model > 0 ? static_cast<int>(world / model) : 0;
}

int ParallelLayout::edp() const {
  const std::int64_t model = std::int64_t{expert_tp()} * ep * pp;
  return model > 0 ? static_cast<int>(world / model) : 0;
}

void ParallelLayout::validate() const {
  const std::string w = std::to_string(world);
  if (world < 1) {
    throw ConfigError(kFile, "world", "must be at least 1 emulated GPU, got " + w);
  }
  const std::string hint =
      "; set a divisor of the world size " + w + " (" + divisors_of(world) + ")";
  check_positive("tensor_model_parallel_size", tp, hint);
  check_positive("context_parallel_size", cp, hint);
  check_positive("expert_model_parallel_size", ep, hint);
  check_positive("pipeline_model_parallel_size", pp, hint);
  if (etp < 0) {
    throw ConfigError(kFile, "expert_tensor_parallel_size",
                      "must be at least 1, or 0 to follow tensor_model_parallel_size, got " +
                          std::to_string(etp) + hint);
  }

  // Attention generator: Megatron requires tp * cp * pp to divide the world (data parallel fills
  // the rest). Name the first size, in that product's order, that breaks divisibility.
  const std::int64_t tp64 = tp, cp64 = cp, pp64 = pp;
  if (world % tp64 != 0) {
    throw ConfigError(kFile, "tensor_model_parallel_size",
                      std::to_string(tp) + " does not divide the world size " + w + hint);
  }
  if (world % (tp64 * cp64) != 0) {
    const std::int64_t rest = world / tp64;
    throw ConfigError(kFile, "context_parallel_size",
                      "tensor_model_parallel_size " + std::to_string(tp) +
                          " x context_parallel_size " + std::to_string(cp) +
                          " does not divide the world size " + w +
                          "; set context_parallel_size to a divisor of " + std::to_string(rest) +
                          " (" + divisors_of(rest) + ")");
  }
  if (world % (tp64 * cp64 * pp64) != 0) {
    const std::int64_t rest = world / (tp64 * cp64);
    throw ConfigError(kFile, "pipeline_model_parallel_size",
                      "tensor_model_parallel_size " + std::to_string(tp) +
                          " x context_parallel_size " + std::to_string(cp) +
                          " x pipeline_model_parallel_size " + std::to_string(pp) +
                          " does not divide the world size " + w +
                          "; set pipeline_model_parallel_size to a divisor of " +
                          std::to_string(rest) + " (" + divisors_of(rest) + ")");
  }

  // Expert generator: etp * ep * pp must divide the world (expert data parallel fills the rest).
  // pp already divides the world here, so blame etp when etp * pp does not, else ep.
  const int etp_eff = expert_tp();
  const std::int64_t etp64 = etp_eff, ep64 = ep;
  const std::string etp_text =
      etp == 0 ? "expert_tensor_parallel_size (unset, so tensor_model_parallel_size) " +
                     std::to_string(etp_eff)
               : "expert_tensor_parallel_size " + std::to_string(etp_eff);
  const std::string expert_product = etp_text + " x expert_model_parallel_size " +
                                     std::to_string(ep) + " x pipeline_model_parallel_size " +
                                     std::to_string(pp) + " does not divide the world size " + w;
  if (world % (etp64 * pp64) != 0) {
    const std::int64_t rest = world / pp64;
    throw ConfigError(kFile, "expert_tensor_parallel_size",
                      expert_product + "; set expert_tensor_parallel_size to a divisor of " +
                          std::to_string(rest) + " (" + divisors_of(rest) + ")");
  }
  if (world % (etp64 * ep64 * pp64) != 0) {
    const std::int64_t rest = world / (etp64 * pp64);
    throw ConfigError(kFile, "expert_model_parallel_size",
                      expert_product + "; set expert_model_parallel_size to a divisor of " +
                          std::to_string(rest) + " (" + divisors_of(rest) + ")");
  }

  // Order: Megatron's RankGenerator accepts an order that leaves out a name only when that
  // name's size is 1 in the generator; both generators share the string, so a name may be left
  // out only when it is 1 in both.
  const std::vector<std::string> names = parse_order(order);
  const GeneratorSizes att = attention_sizes(*this), exp = expert_sizes(*this);
  for (std::string_view n : kNames) {
    if (std::find(names.begin(), names.end(), n) != names.end()) continue;
    const int a = att.of(n), e = exp.of(n);
    if (a != 1 || e != 1) {
      throw ConfigError(kFile, "order",
                        "'" + order + "' leaves out " + std::string(n) + ", whose size is " +
                            std::to_string(a != 1 ? a : e) + (a != 1 ? "" : " in expert layers") +
                            "; add " + std::string(n) + " to the order (default tp-cp-ep-dp-pp)");
    }
  }

  // initialize_model_parallel asserts that an order not ending in pp is used only without
  // pipeline parallelism or with equal attention and expert data parallel sizes, because
  // otherwise the two generators would disagree on the pipeline groups.
  if (names.back() != "pp" && pp > 1 && dp() != edp()) {
    throw ConfigError(kFile, "order",
                      "'" + order +
                          "' does not end in pp, which Megatron allows with "
                          "pipeline_model_parallel_size " +
                          std::to_string(pp) + " only when the attention data parallel size (" +
                          std::to_string(dp()) + ") equals the expert data parallel size (" +
                          std::to_string(edp()) + "); put pp last or change the expert sizes");
  }
}

std::string_view to_string(GroupKind k) {
  switch (k) {
    case GroupKind::TP:
      return "tp";
    case GroupKind::CP:
      return "cp";
    case GroupKind::DP:
      return "dp";
    case GroupKind::DP_CP:
      return "dp-cp";
    case GroupKind::PP:
      return "pp";
    case GroupKind::TP_CP:
      return "tp-cp";
    case GroupKind::EP:
      return "ep";
    case GroupKind::ETP:
      return "etp";
    case GroupKind::EDP:
      return "edp";
    case GroupKind::TP_EP:
      return "tp-ep";
    case GroupKind::MP:
      return "mp";
  }
  return "?";
}

std::vector<std::vector<int>> orthogonal_groups(const std::vector<int>& sizes,
                                                const std::vector<bool>& mask) {
  if (sizes.size() != mask.size()) {
    throw UsageError("orthogonal_groups: " + std::to_string(sizes.size()) + " sizes but " +
                     std::to_string(mask.size()) + " mask entries; pass one mask entry per size");
  }
  // Global stride of each dimension: the product of the sizes before it (first is fastest).
  std::vector<std::int64_t> stride(sizes.size());
  std::int64_t world = 1;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] < 1) {
      throw UsageError("orthogonal_groups: size " + std::to_string(i) + " is " +
                       std::to_string(sizes[i]) + "; every size must be at least 1");
    }
    stride[i] = world;
    world *= sizes[i];
  }
  std::vector<int> in_size, out_size;
  std::vector<std::int64_t> in_stride, out_stride;
  for (size_t i = 0; i < sizes.size(); ++i) {
    (mask[i] ? in_size : out_size).push_back(sizes[i]);
    (mask[i] ? in_stride : out_stride).push_back(stride[i]);
  }
  // Map a combined index over some dimensions (first fastest) to its offset in the global grid.
  auto offset = [](std::int64_t index, const std::vector<int>& dims,
                   const std::vector<std::int64_t>& strides) {
    std::int64_t off = 0;
    for (size_t i = 0; i < dims.size(); ++i) {
      off += (index % dims[i]) * strides[i];
      index /= dims[i];
    }
    return off;
  };
  std::int64_t group_size = 1;
  for (int s : in_size) group_size *= s;
  const std::int64_t group_count = world / group_size;

  std::vector<std::vector<int>> groups(static_cast<size_t>(group_count));
  for (std::int64_t g = 0; g < group_count; ++g) {
    const std::int64_t base = offset(g, out_size, out_stride);
    std::vector<int>& ranks = groups[static_cast<size_t>(g)];
    ranks.reserve(static_cast<size_t>(group_size));
    for (std::int64_t r = 0; r < group_size; ++r) {
      ranks.push_back(static_cast<int>(base + offset(r, in_size, in_stride)));
    }
  }
  return groups;
}

ProcessGroups::ProcessGroups(ParallelLayout layout) : layout_(std::move(layout)) {
  layout_.validate();
  const std::vector<std::string> names = parse_order(layout_.order);
  const Generator attention(names, attention_sizes(layout_));
  const Generator expert(names, expert_sizes(layout_));

  // The token each kind is built from, in the generator initialize_model_parallel uses for it.
  struct Source {
    GroupKind kind;
    const Generator* gen;
    std::vector<std::string_view> tokens;
  };
  const std::vector<Source> sources = {
      {GroupKind::TP, &attention, {"tp"}},       {GroupKind::CP, &attention, {"cp"}},
      {GroupKind::DP, &attention, {"dp"}},       {GroupKind::DP_CP, &attention, {"dp", "cp"}},
      {GroupKind::PP, &attention, {"pp"}},       {GroupKind::TP_CP, &attention, {"tp", "cp"}},
      {GroupKind::EP, &expert, {"ep"}},          {GroupKind::ETP, &expert, {"tp"}},
      {GroupKind::EDP, &expert, {"dp"}},         {GroupKind::TP_EP, &expert, {"tp", "ep"}},
      {GroupKind::MP, &attention, {"tp", "pp"}},
  };

  // Megatron asserts that both generators give the same pipeline groups; validate() already
  // rejects the layouts where they would not, so this only guards the arithmetic.
  if (attention.ranks({"pp"}) != expert.ranks({"pp"})) {
    throw ConfigError(kFile, "order",
                      "'" + layout_.order +
                          "' gives attention and expert layers different pipeline groups; put pp "
                          "last in the order");
  }

  kinds_.resize(kGroupKindCount);
  for (const Source& s : sources) {
    Kind& k = kinds_[static_cast<size_t>(s.kind)];
    k.groups = s.gen->ranks(s.tokens);
    k.group_of_rank.assign(static_cast<size_t>(layout_.world), -1);
    k.index_in_group.assign(static_cast<size_t>(layout_.world), -1);
    for (size_t g = 0; g < k.groups.size(); ++g) {
      for (size_t i = 0; i < k.groups[g].size(); ++i) {
        const auto r = static_cast<size_t>(k.groups[g][i]);
        k.group_of_rank[r] = static_cast<int>(g);
        k.index_in_group[r] = static_cast<int>(i);
      }
    }
  }
}

const ProcessGroups::Kind& ProcessGroups::kind(GroupKind k, int rank) const {
  if (rank < 0 || rank >= layout_.world) {
    throw UsageError("parallel layout: rank " + std::to_string(rank) + " is outside the world of " +
                     std::to_string(layout_.world) + " ranks (0.." +
                     std::to_string(layout_.world - 1) + ")");
  }
  return kinds_[static_cast<size_t>(k)];
}

const std::vector<std::vector<int>>& ProcessGroups::groups(GroupKind k) const {
  return kinds_[static_cast<size_t>(k)].groups;
}

const std::vector<int>& ProcessGroups::group_of(GroupKind k, int rank) const {
  const Kind& kd = kind(k, rank);
  return kd.groups[static_cast<size_t>(kd.group_of_rank[static_cast<size_t>(rank)])];
}

int ProcessGroups::rank_in(GroupKind k, int rank) const {
  return kind(k, rank).index_in_group[static_cast<size_t>(rank)];
}

int ProcessGroups::group_index(GroupKind k, int rank) const {
  return kind(k, rank).group_of_rank[static_cast<size_t>(rank)];
}

std::string ProcessGroups::describe(int rank) const {
  // A rank's coordinate in a dimension is its index inside that dimension's group, which is what
  // Megatron's get_tensor_model_parallel_rank() and friends return.
  auto coord = [&](const char* label, GroupKind k) {
    return std::string(label) + " " + std::to_string(rank_in(k, rank)) + "/" +
           std::to_string(group_of(k, rank).size());
  };
  return "rank " + std::to_string(rank) + ": " + coord("tp", GroupKind::TP) + " " +
         coord("cp", GroupKind::CP) + " " + coord("dp", GroupKind::DP) + " " +
         coord("pp", GroupKind::PP) + " | " + coord("etp", GroupKind::ETP) + " " +
         coord("ep", GroupKind::EP) + " " + coord("edp", GroupKind::EDP);
}

}  // namespace nodeemu
