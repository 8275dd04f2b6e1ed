// Errors of comm/ at its API boundary.
#pragma once

#include <cstdint>
#include <string>

#include "devices/errors.hpp"

namespace nodeemu {

// Two ranks of a group issued different collectives at the same position of the group's
// sequence (Megatron-LM #1810, DeepEP #496: on real GPUs this hangs). The message names the
// group and its ranks, the sequence number and both calls.
class CollectiveMismatchError : public Error {
 public:
  CollectiveMismatchError(const std::string& group, std::uint64_t seq, int rank_a,
                          const std::string& call_a, int rank_b, const std::string& call_b)
      : Error("collective mismatch in group " + group + " at call #" + std::to_string(seq) +
              ": rank " + std::to_string(rank_a) + " issued " + call_a + " but rank " +
              std::to_string(rank_b) + " issued " + call_b +
              "; every rank of a group must issue the same collectives, with matching sizes, "
              "in the same order"),
        seq_(seq),
        rank_a_(rank_a),
        rank_b_(rank_b) {}
  std::uint64_t seq() const { return seq_; }
  int rank_a() const { return rank_a_; }
  int rank_b() const { return rank_b_; }

 private:
  std::uint64_t seq_;
  int rank_a_, rank_b_;
};

}  // namespace nodeemu
