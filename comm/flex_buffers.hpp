// The persistent buffers DeepEP's and HybridEP's Buffer hold on every GPU, which count in its
// memory. Megatron keeps one per process, shared by every layer (fused_a2a.py get_buffer and
// _HybridEPManager: made on the first dispatch, made again larger when a call needs more).
#pragma once
#include <cstdint>

namespace nodeemu {

// DeepEP's Config.get_nvl_buffer_size_hint / get_rdma_buffer_size_hint (csrc/config.hpp) for
// `ranks` EP ranks and `sms` SMs, the larger of the dispatch and combine configs of
// Buffer.get_dispatch_config / get_combine_config (deep_ep/buffer.py), with Megatron's
// hidden_bytes = hidden * max(element size, 2). `ranks` must be in DeepEP's table (2, 4, 8, 16,
// 24, 32, 48, 64, 96, 128, 144, 160); 0 otherwise.
std::uint64_t deepep_nvl_buffer_bytes(int hidden_bytes, int ranks, int sms);
std::uint64_t deepep_rdma_buffer_bytes(int hidden_bytes, int ranks, int sms);
// What NVSHMEM takes for an RDMA buffer: whole granules of 2^29 bytes
// (NVSHMEM_CUMEM_GRANULARITY, set by DeepEP's Buffer.__init__ across nodes).
std::uint64_t nvshmem_granules(std::uint64_t bytes);

// HybridEP's token and probability buffers (csrc/hybrid_ep/config.cuh Configurer,
// buffer/intranode.cu): room for max(tokens, 512) rounded up to 64 tokens per rank from every
// rank of every node, hidden bf16 values each (dispatch output and combine input share it,
// use_shared_buffer), and an fp32 probability per expert of the node.
std::uint64_t hybridep_buffer_bytes(int tokens_per_rank, int hidden, int ranks_per_node, int nodes,
                                    int experts_per_node);

}  // namespace nodeemu
