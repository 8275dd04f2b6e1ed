// Process groups from a parallel layout, checked against groups worked out by hand from
// Megatron-Core's RankGenerator rules: the first name of the order varies fastest, a group varies
// only in its named dimensions, and groups are listed by the other dimensions' combined index.
#include "comm/parallel_layout.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "devices/errors.hpp"

namespace nodeemu {
namespace {

using Groups = std::vector<std::vector<int>>;

ParallelLayout layout(int world, int tp, int cp, int ep, int pp, int etp = 0,
                      std::string order = "tp-cp-ep-dp-pp") {
  ParallelLayout l;
  l.world = world;
  l.tp = tp;
  l.cp = cp;
  l.ep = ep;
  l.pp = pp;
  l.etp = etp;
  l.order = std::move(order);
  return l;
}

// Runs validate() and returns the ConfigError it throws (or fails the test).
ConfigError config_error(const ParallelLayout& l) {
  try {
    l.validate();
  } catch (const ConfigError& e) {
    return e;
  }
  ADD_FAILURE() << "no ConfigError for world " << l.world << " tp " << l.tp << " cp " << l.cp
                << " ep " << l.ep << " pp " << l.pp << " etp " << l.etp << " order " << l.order;
  return ConfigError("", "", "");
}

bool mentions(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(OrthogonalGroups, MegatronDocstringExample) {
  // sizes tp 2, dp 3, pp 4 in that order, only dp varying: 8 groups of 3.
  Groups g = orthogonal_groups({2, 3, 4}, {false, true, false});
  ASSERT_EQ(g.size(), 8u);
  EXPECT_EQ(g[0], (std::vector<int>{0, 2, 4}));
  EXPECT_EQ(g[1], (std::vector<int>{1, 3, 5}));
  EXPECT_EQ(g[2], (std::vector<int>{6, 8, 10}));
  EXPECT_EQ(g[7], (std::vector<int>{19, 21, 23}));
}

TEST(OrthogonalGroups, FirstMaskedDimensionIsFastestInsideAGroup) {
  // sizes 2 x 2 x 2 with the first and last varying: within a group, dim 0 (stride 1) changes
  // first, then dim 2 (stride 4); the groups are listed by dim 1.
  EXPECT_EQ(orthogonal_groups({2, 2, 2}, {true, false, true}),
            (Groups{{0, 1, 4, 5}, {2, 3, 6, 7}}));
  EXPECT_EQ(orthogonal_groups({2, 2, 2}, {true, true, true}), (Groups{{0, 1, 2, 3, 4, 5, 6, 7}}));
  EXPECT_EQ(orthogonal_groups({2, 2, 2}, {false, false, false}),
            (Groups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
}

TEST(OrthogonalGroups, RejectsBadArguments) {
  EXPECT_THROW(orthogonal_groups({2, 2}, {true}), UsageError);
  EXPECT_THROW(orthogonal_groups({2, 0}, {true, false}), UsageError);
}

TEST(ParallelLayout, DefaultsAndDerivedSizes) {
  ParallelLayout l;
  EXPECT_EQ(l.order, "tp-cp-ep-dp-pp");
  EXPECT_NO_THROW(l.validate());
  EXPECT_EQ(l.dp(), 1);
  EXPECT_EQ(l.edp(), 1);

  l = layout(8, 2, 1, 4, 1);
  EXPECT_EQ(l.expert_tp(), 2);  // etp unset follows tp
  EXPECT_EQ(l.dp(), 4);
  EXPECT_EQ(l.edp(), 1);
  l.etp = 1;
  EXPECT_EQ(l.edp(), 2);
}

TEST(ProcessGroups, TensorAndPipelineParallelOnEightRanks) {
  ProcessGroups pg(layout(8, 2, 1, 1, 2));
  EXPECT_EQ(pg.groups(GroupKind::TP), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(pg.groups(GroupKind::DP), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(pg.groups(GroupKind::PP), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(pg.groups(GroupKind::MP), (Groups{{0, 1, 4, 5}, {2, 3, 6, 7}}));
  EXPECT_EQ(pg.groups(GroupKind::CP), (Groups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
  // Without cp the dp-cp group is the dp group, and tp-cp is tp.
  EXPECT_EQ(pg.groups(GroupKind::DP_CP), pg.groups(GroupKind::DP));
  EXPECT_EQ(pg.groups(GroupKind::TP_CP), pg.groups(GroupKind::TP));
  // Unset etp follows tp, so the expert side folds exactly like the attention side.
  EXPECT_EQ(pg.groups(GroupKind::ETP), pg.groups(GroupKind::TP));
  EXPECT_EQ(pg.groups(GroupKind::EDP), pg.groups(GroupKind::DP));
  EXPECT_EQ(pg.groups(GroupKind::TP_EP), pg.groups(GroupKind::TP));
  EXPECT_EQ(pg.groups(GroupKind::EP), (Groups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));

  EXPECT_EQ(pg.group_of(GroupKind::PP, 6), (std::vector<int>{2, 6}));
  EXPECT_EQ(pg.rank_in(GroupKind::PP, 6), 1);
  EXPECT_EQ(pg.group_index(GroupKind::PP, 6), 2);
  EXPECT_EQ(pg.rank_in(GroupKind::TP, 5), 1);
  EXPECT_EQ(pg.group_index(GroupKind::DP, 5), 3);
}

TEST(ProcessGroups, MegatronSixteenGpuExample) {
  // initialize_model_parallel's docstring: 16 GPUs, tp 2, pp 4.
  ProcessGroups pg(layout(16, 2, 1, 1, 4));
  EXPECT_EQ(pg.groups(GroupKind::DP),
            (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(pg.groups(GroupKind::TP),
            (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(pg.groups(GroupKind::PP),
            (Groups{{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}}));
}

TEST(ProcessGroups, Qwen3ExpertParallelOverSixteenRanks) {
  ProcessGroups pg(layout(16, 1, 1, 16, 1));
  EXPECT_EQ(pg.layout().dp(), 16);
  EXPECT_EQ(pg.layout().edp(), 1);
  std::vector<int> all(16);
  for (int r = 0; r < 16; ++r) all[r] = r;
  EXPECT_EQ(pg.groups(GroupKind::EP), (Groups{all}));
  EXPECT_EQ(pg.groups(GroupKind::DP), (Groups{all}));
  EXPECT_EQ(pg.groups(GroupKind::DP_CP), (Groups{all}));
  EXPECT_EQ(pg.groups(GroupKind::TP_EP), (Groups{all}));
  ASSERT_EQ(pg.groups(GroupKind::EDP).size(), 16u);
  for (int r = 0; r < 16; ++r) {
    EXPECT_EQ(pg.group_of(GroupKind::EDP, r), (std::vector<int>{r}));
    EXPECT_EQ(pg.rank_in(GroupKind::EP, r), r);
    EXPECT_EQ(pg.group_of(GroupKind::TP, r), (std::vector<int>{r}));
  }
}

TEST(ProcessGroups, ParallelFoldingOfAttentionAndExperts) {
  // Attention: tp 2 x dp 4. Experts: etp 1 x ep 4 x edp 2 over the same eight ranks.
  ProcessGroups pg(layout(8, 2, 1, 4, 1, /*etp=*/1));
  EXPECT_EQ(pg.layout().dp(), 4);
  EXPECT_EQ(pg.layout().edp(), 2);
  EXPECT_EQ(pg.groups(GroupKind::TP), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(pg.groups(GroupKind::DP), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(pg.groups(GroupKind::EP), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(pg.groups(GroupKind::EDP), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(pg.groups(GroupKind::ETP), (Groups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
  EXPECT_EQ(pg.groups(GroupKind::TP_EP), pg.groups(GroupKind::EP));
  EXPECT_EQ(pg.group_of(GroupKind::EP, 0), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(pg.group_of(GroupKind::EDP, 0), (std::vector<int>{0, 4}));
  EXPECT_EQ(pg.rank_in(GroupKind::EP, 5), 1);
  EXPECT_EQ(pg.rank_in(GroupKind::EDP, 5), 1);
  EXPECT_EQ(pg.rank_in(GroupKind::DP, 5), 2);
  EXPECT_EQ(pg.describe(5), "rank 5: tp 1/2 cp 0/1 dp 2/4 pp 0/1 | etp 0/1 ep 1/4 edp 1/2");
}

TEST(ProcessGroups, ExpertTensorParallelInsideExpertModelParallel) {
  // etp 2 x ep 2 x edp 2: etp is fastest, so an ep group strides over etp.
  ProcessGroups pg(layout(8, 2, 1, 2, 1, /*etp=*/2));
  EXPECT_EQ(pg.groups(GroupKind::ETP), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(pg.groups(GroupKind::EP), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(pg.groups(GroupKind::TP_EP), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(pg.groups(GroupKind::EDP), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(pg.describe(6), "rank 6: tp 0/2 cp 0/1 dp 3/4 pp 0/1 | etp 0/2 ep 1/2 edp 1/2");
}

TEST(ProcessGroups, ContextParallelGroups) {
  ProcessGroups pg(layout(8, 2, 2, 1, 1));
  EXPECT_EQ(pg.layout().dp(), 2);
  EXPECT_EQ(pg.groups(GroupKind::CP), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(pg.groups(GroupKind::DP), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  // Gradients of non-expert weights reduce over dp x cp; cp is fastest inside the group.
  EXPECT_EQ(pg.groups(GroupKind::DP_CP), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(pg.groups(GroupKind::TP_CP), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  // The expert generator has no cp: the cp ranks join expert data parallel.
  EXPECT_EQ(pg.layout().edp(), 4);
  EXPECT_EQ(pg.groups(GroupKind::EDP), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(pg.describe(6), "rank 6: tp 0/2 cp 1/2 dp 1/2 pp 0/1 | etp 0/2 ep 0/1 edp 3/4");

  // The docstring example: tp 4, cp 2 on 8 GPUs gives cp groups [0,4] [1,5] [2,6] [3,7].
  ProcessGroups pg4(layout(8, 4, 2, 1, 1));
  EXPECT_EQ(pg4.groups(GroupKind::CP), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
}

TEST(ProcessGroups, OrderWithDataParallelLast) {
  ProcessGroups pg(layout(8, 2, 1, 1, 2, 0, "tp-cp-ep-pp-dp"));
  EXPECT_EQ(pg.groups(GroupKind::TP), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(pg.groups(GroupKind::PP), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(pg.groups(GroupKind::DP), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(pg.groups(GroupKind::MP), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(pg.groups(GroupKind::EDP), pg.groups(GroupKind::DP));
}

TEST(ProcessGroups, OrderMayLeaveOutSizeOneNamesAndIgnoresCase) {
  ProcessGroups full(layout(8, 2, 1, 1, 2));
  ProcessGroups short_order(layout(8, 2, 1, 1, 2, 0, "tp-dp-pp"));
  ProcessGroups upper(layout(8, 2, 1, 1, 2, 0, "TP-CP-EP-DP-PP"));
  for (int k = 0; k < kGroupKindCount; ++k) {
    const auto kind = static_cast<GroupKind>(k);
    EXPECT_EQ(short_order.groups(kind), full.groups(kind)) << to_string(kind);
    EXPECT_EQ(upper.groups(kind), full.groups(kind)) << to_string(kind);
  }
  // ep only exists in the expert generator and cp only in the attention one, but both share
  // the order, so either may be left out only when it is 1.
  EXPECT_EQ(config_error(layout(8, 2, 1, 2, 1, 0, "tp-dp-pp")).key(), "order");
  EXPECT_EQ(config_error(layout(8, 2, 2, 1, 1, 0, "tp-ep-dp-pp")).key(), "order");
  // dp is 1 for attention but 2 for experts here.
  EXPECT_EQ(config_error(layout(4, 4, 1, 2, 1, 1, "tp-cp-ep-pp")).key(), "order");
  EXPECT_NO_THROW(layout(4, 4, 1, 2, 1, 1, "tp-cp-ep-dp-pp").validate());
}

TEST(ParallelLayout, SizesThatDoNotDivideTheWorldNameTheirKey) {
  ConfigError e = config_error(layout(6, 4, 1, 1, 1));
  EXPECT_EQ(e.file(), "parallel layout");
  EXPECT_EQ(e.key(), "tensor_model_parallel_size");
  EXPECT_TRUE(mentions(e.what(), "world size 6")) << e.what();
  EXPECT_TRUE(mentions(e.what(), "1, 2, 3, 6")) << e.what();
  EXPECT_TRUE(mentions(e.what(), "parallel layout: tensor_model_parallel_size: ")) << e.what();

  e = config_error(layout(8, 2, 3, 1, 1));
  EXPECT_EQ(e.key(), "context_parallel_size");
  e = config_error(layout(12, 2, 2, 1, 2));
  EXPECT_EQ(e.key(), "pipeline_model_parallel_size");
  EXPECT_TRUE(mentions(e.what(), "divisor of 3")) << e.what();

  e = config_error(layout(8, 2, 1, 3, 1));
  EXPECT_EQ(e.key(), "expert_model_parallel_size");
  EXPECT_TRUE(mentions(e.what(), "world size 8")) << e.what();
  // etp 1 x ep 4 x pp 2 = 8 does not divide 12 although each size does.
  e = config_error(layout(12, 1, 1, 4, 2, 1));
  EXPECT_EQ(e.key(), "expert_model_parallel_size");
  EXPECT_TRUE(mentions(e.what(), "divisor of 6")) << e.what();
  e = config_error(layout(8, 2, 1, 1, 1, 3));
  EXPECT_EQ(e.key(), "expert_tensor_parallel_size");
}

TEST(ParallelLayout, SizesBelowOneAreRejected) {
  EXPECT_EQ(config_error(layout(8, 0, 1, 1, 1)).key(), "tensor_model_parallel_size");
  EXPECT_EQ(config_error(layout(8, 1, 0, 1, 1)).key(), "context_parallel_size");
  EXPECT_EQ(config_error(layout(8, 1, 1, 0, 1)).key(), "expert_model_parallel_size");
  EXPECT_EQ(config_error(layout(8, 1, 1, 1, 0)).key(), "pipeline_model_parallel_size");
  EXPECT_EQ(config_error(layout(8, 1, 1, 1, 1, -1)).key(), "expert_tensor_parallel_size");
  EXPECT_EQ(config_error(layout(0, 1, 1, 1, 1)).key(), "world");
  EXPECT_THROW(ProcessGroups(layout(8, 0, 1, 1, 1)), ConfigError);
}

TEST(ParallelLayout, BadOrderStringsNameOrder) {
  for (const char* order :
       {"tp-cp-ep-dp-xp", "tp-tp-cp-ep-dp-pp", "tp--cp-ep-dp-pp", "", "tp,cp,ep,dp,pp"}) {
    ConfigError e = config_error(layout(8, 2, 1, 2, 2, 0, order));
    EXPECT_EQ(e.key(), "order") << order;
    EXPECT_TRUE(mentions(e.what(), "tp-cp-ep-dp-pp")) << e.what();
  }
  // Megatron lets an order not ending in pp through only when attention and expert data
  // parallel agree (here dp 2, edp 1), else the two sides would disagree on pipeline groups.
  ConfigError e = config_error(layout(8, 2, 1, 4, 2, 1, "tp-cp-ep-pp-dp"));
  EXPECT_EQ(e.key(), "order");
  EXPECT_TRUE(mentions(e.what(), "(2)")) << e.what();
  EXPECT_TRUE(mentions(e.what(), "(1)")) << e.what();
  EXPECT_NO_THROW(layout(8, 2, 1, 4, 1, 1, "tp-cp-ep-pp-dp").validate());  // pp 1 is fine
}

TEST(ProcessGroups, RanksOutsideTheWorldAreRejected) {
  ProcessGroups pg(layout(4, 2, 1, 1, 1));
  EXPECT_THROW(pg.group_of(GroupKind::TP, 4), UsageError);
  EXPECT_THROW(pg.rank_in(GroupKind::DP, -1), UsageError);
  EXPECT_THROW(pg.describe(7), UsageError);
}

TEST(GroupKind, Names) {
  EXPECT_EQ(to_string(GroupKind::DP_CP), "dp-cp");
  EXPECT_EQ(to_string(GroupKind::TP_EP), "tp-ep");
  EXPECT_EQ(to_string(GroupKind::EDP), "edp");
  EXPECT_EQ(to_string(GroupKind::MP), "mp");
}

// Every rank's coordinates, by name, in one generator of a layout, computed the direct way:
// peel the sizes off the rank in order, first name fastest.
std::map<std::string, int> coords(int rank, const std::vector<std::pair<std::string, int>>& dims) {
  std::map<std::string, int> c;
  for (const auto& [name, size] : dims) {
    c[name] = rank % size;
    rank /= size;
  }
  return c;
}

std::vector<std::pair<std::string, int>> dims_in_order(const ParallelLayout& l, bool expert) {
  std::map<std::string, int> size = {{"tp", expert ? l.expert_tp() : l.tp},
                                     {"cp", expert ? 1 : l.cp},
                                     {"ep", expert ? l.ep : 1},
                                     {"dp", expert ? l.edp() : l.dp()},
                                     {"pp", l.pp}};
  std::vector<std::pair<std::string, int>> out;
  std::string order = l.order;
  size_t start = 0;
  while (start <= order.size()) {
    size_t end = order.find('-', start);
    if (end == std::string::npos) end = order.size();
    const std::string name = order.substr(start, end - start);
    out.emplace_back(name, size.at(name));
    size.erase(name);
    start = end + 1;
  }
  for (const auto& [name, s] : size) out.emplace_back(name, s);  // all 1
  return out;
}

TEST(ProcessGroups, EveryRankIsInExactlyOneGroupOfEachKind) {
  const std::vector<ParallelLayout> layouts = {
      layout(1, 1, 1, 1, 1),
      layout(8, 2, 1, 1, 2),
      layout(8, 2, 2, 2, 1, 1),
      layout(16, 1, 1, 16, 1),
      layout(16, 2, 2, 4, 2, 1),
      layout(16, 4, 1, 2, 2, 2),
      layout(24, 2, 3, 2, 2, 1),
      layout(32, 2, 2, 4, 2, 2, "tp-cp-ep-dp-pp"),
      layout(16, 2, 2, 4, 2, 1, "tp-cp-ep-pp-dp"),
      layout(16, 2, 2, 2, 2, 2, "tp-cp-ep-pp-dp"),
      layout(16, 2, 2, 4, 1, 1, "pp-dp-ep-cp-tp"),
  };
  // Which names vary inside each kind, and in which generator.
  struct Spec {
    GroupKind kind;
    bool expert;
    std::vector<std::string> varying;
  };
  const std::vector<Spec> specs = {
      {GroupKind::TP, false, {"tp"}},       {GroupKind::CP, false, {"cp"}},
      {GroupKind::DP, false, {"dp"}},       {GroupKind::DP_CP, false, {"cp", "dp"}},
      {GroupKind::PP, false, {"pp"}},       {GroupKind::TP_CP, false, {"tp", "cp"}},
      {GroupKind::EP, true, {"ep"}},        {GroupKind::ETP, true, {"tp"}},
      {GroupKind::EDP, true, {"dp"}},       {GroupKind::TP_EP, true, {"tp", "ep"}},
      {GroupKind::MP, false, {"tp", "pp"}},
  };
  for (const ParallelLayout& l : layouts) {
    ProcessGroups pg(l);
    const std::string where = "world " + std::to_string(l.world) + " tp " + std::to_string(l.tp) +
                              " cp " + std::to_string(l.cp) + " ep " + std::to_string(l.ep) +
                              " pp " + std::to_string(l.pp) + " etp " + std::to_string(l.etp) +
                              " order " + l.order;
    for (const Spec& s : specs) {
      const auto dims = dims_in_order(l, s.expert);
      int expected_size = 1;
      for (const auto& [name, size] : dims) {
        if (std::count(s.varying.begin(), s.varying.end(), name)) expected_size *= size;
      }
      std::vector<int> seen(static_cast<size_t>(l.world), 0);
      const Groups& groups = pg.groups(s.kind);
      ASSERT_EQ(groups.size() * expected_size, static_cast<size_t>(l.world))
          << where << " " << to_string(s.kind);
      for (size_t g = 0; g < groups.size(); ++g) {
        ASSERT_EQ(groups[g].size(), static_cast<size_t>(expected_size));
        const auto first = coords(groups[g][0], dims);
        for (size_t i = 0; i < groups[g].size(); ++i) {
          const int r = groups[g][i];
          ASSERT_GE(r, 0);
          ASSERT_LT(r, l.world);
          ++seen[static_cast<size_t>(r)];
          EXPECT_EQ(pg.group_index(s.kind, r), static_cast<int>(g));
          EXPECT_EQ(pg.rank_in(s.kind, r), static_cast<int>(i));
          EXPECT_EQ(&pg.group_of(s.kind, r), &groups[g]);
          // Only the varying names change inside a group.
          const auto c = coords(r, dims);
          for (const auto& [name, size] : dims) {
            if (!std::count(s.varying.begin(), s.varying.end(), name)) {
              EXPECT_EQ(c.at(name), first.at(name)) << where << " " << to_string(s.kind);
            }
          }
        }
      }
      for (int r = 0; r < l.world; ++r) {
        EXPECT_EQ(seen[static_cast<size_t>(r)], 1)
            << where << " " << to_string(s.kind) << " rank " << r;
      }
    }
    // A tp group and a dp group meet in exactly one rank; so do ep and edp.
    for (int r = 0; r < l.world; ++r) {
      for (auto [a, b] :
           {std::pair{GroupKind::TP, GroupKind::DP}, std::pair{GroupKind::EP, GroupKind::EDP},
            std::pair{GroupKind::TP, GroupKind::PP}}) {
        const auto& ga = pg.group_of(a, r);
        int common = 0;
        for (int x : pg.group_of(b, r)) common += std::count(ga.begin(), ga.end(), x);
        EXPECT_EQ(common, 1) << where;
      }
    }
    // Both generators agree on the pipeline groups, as Megatron asserts.
    for (int r = 0; r < l.world; ++r) {
      EXPECT_EQ(coords(r, dims_in_order(l, false)).at("pp"),
                coords(r, dims_in_order(l, true)).at("pp"))
          << where;
    }
  }
}

}  // namespace
}  // namespace nodeemu
