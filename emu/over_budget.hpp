// The check Megatron's PagedStashRunner makes after every forward-backward when
// moe_expert_rank_capacity_factor is set (megatron/core/transformer/moe/paged_stash.py
// check_moe_overflow): each rank's over-budget flags (any HybridEP dispatch that dropped pairs
// past its budget), summed over every rank in one all-reduce, read once on the host. If any rank
// dropped, the runner clears the gradients and runs the step again with the budget off
// (prepare_for_rerun: dropless, host-synchronised), then turns it back on for the next step.
#pragma once
#include <memory>
#include <vector>

#include "comm/group.hpp"
#include "layers/model_chunk.hpp"

namespace nodeemu::emu {

using Chunks = std::vector<std::unique_ptr<layers::ModelChunk>>;

// Ranks whose dispatchers dropped pairs since the last reset, over `world` (every rank calls it,
// after its schedule, on `s`); resets the flags. Meta mode has no flags on the device: each
// rank's own comes from its host-known routing, and `shared` (two rounds of one slot per world
// member, shared by the ranks of a run) carries them to the others. `round` counts the calls: a
// rank cannot be two calls ahead of another, as each waits for the all-reduce.
int ranks_over_budget(Chunks& chunks, Group& world, Stream& s, std::vector<int>& shared, int round);

// PagedStashRunner.prepare_for_rerun: the plans made from now on are dropless and repeat the
// step's micro-batches (meta mode's routing is keyed by how often each was planned).
void prepare_for_rerun(Chunks& chunks);
// The budget back on for the next step.
void restore_budget(Chunks& chunks);

}  // namespace nodeemu::emu
