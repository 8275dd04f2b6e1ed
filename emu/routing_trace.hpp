// Megatron-Core's router trace as meta mode's routing (emulator.routing_trace). Megatron writes
// one JSONL file per rank (megatron/core/transformer/moe/router_trace.py, --moe-routing-trace-path:
// router_trace_rank{rank}.jsonl), one record per router call:
//   {"step": 0, "block": "decoder", "layer": 3, "rank": 0, "num_tokens": 4096, "topk": 8,
//    "top_indices": [[12, 45, ...], ...]}
// NodeEmu keeps each record's tokens per expert. Decoder records only (MTP records, which carry
// "mtp_idx", are left out); layers are matched by number, so a trace of the same model and
// pipeline layout is what replays (Megatron numbers the layers of each pipeline stage from 0).
#pragma once
#include <string>

#include "layers/meta_routing.hpp"

namespace nodeemu::emu {

// `path`: one trace file, or a folder of router_trace_rank*.jsonl. Throws ConfigError naming the
// file and line for a record it cannot use, or an expert index >= `experts`.
layers::RecordedLoads load_routing_trace(const std::string& path, int experts);

}  // namespace nodeemu::emu
