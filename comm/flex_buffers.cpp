#include "comm/flex_buffers.hpp"

#include <algorithm>

namespace nodeemu {

namespace {

std::uint64_t align_up(std::uint64_t v, std::uint64_t a) {
  return (v + a - 1) / a * a;
}

// Config(num_sms, nvl_send, nvl_recv, rdma_send, rdma_recv) without num_sms, of
// Buffer.get_dispatch_config and get_combine_config (deep_ep/buffer.py, DeepEP main dd758caf).
struct Chunking {
  int nvl_recv, rdma_send, rdma_recv;
};
struct TableRow {
  int ranks;
  Chunking dispatch, combine;
};
constexpr TableRow kTable[] = {
    {2, {256, 6, 128}, {256, 6, 128}},    {4, {256, 6, 128}, {256, 6, 128}},
    {8, {256, 6, 128}, {256, 6, 128}},    {16, {288, 20, 128}, {288, 12, 128}},
    {24, {288, 8, 128}, {288, 8, 128}},   {32, {288, 8, 128}, {288, 8, 128}},
    {48, {288, 8, 128}, {288, 8, 128}},   {64, {288, 8, 128}, {288, 8, 128}},
    {96, {480, 12, 128}, {480, 8, 128}},  {128, {560, 12, 128}, {560, 8, 128}},
    {144, {720, 12, 128}, {720, 8, 128}}, {160, {720, 12, 128}, {720, 8, 128}},
};

const TableRow* row_for(int ranks) {
  for (const TableRow& r : kTable)
    if (r.ranks == ranks) return &r;
  return nullptr;
}

constexpr std::uint64_t kMaxPeers = 8;  // NUM_MAX_NVL_PEERS
// Per token slot beyond the hidden bytes: SourceMeta (8), 128 int64 top-k ids, 128 fp32 weights
// and 128 fp32 scales (kNumMaxTopK = kNumMaxScales = 128).
constexpr std::uint64_t kNvlSlotExtra = 8 + 128 * 8 + 128 * 4 + 128 * 4;
constexpr std::uint64_t kRdmaSlotExtra = kNvlSlotExtra + 16;

std::uint64_t nvl_hint(std::uint64_t hidden_bytes, int ranks, int sms, const Chunking& c) {
  const std::uint64_t channels = std::uint64_t(sms) / 2;
  const std::uint64_t nvl = std::min<std::uint64_t>(std::uint64_t(ranks), kMaxPeers);
  const std::uint64_t rdma = std::max<std::uint64_t>(std::uint64_t(ranks) / kMaxPeers, 1);
  const std::uint64_t bytes =
      channels * nvl * (2 * rdma + 3) * 4 +
      channels * nvl * std::uint64_t(c.nvl_recv) * (hidden_bytes + kNvlSlotExtra);
  return align_up(bytes, 128);
}

std::uint64_t rdma_hint(std::uint64_t hidden_bytes, int ranks, int sms, const Chunking& c) {
  if (ranks <= int(kMaxPeers)) return 0;
  const std::uint64_t channels = std::uint64_t(sms) / 2;
  const std::uint64_t rdma = std::uint64_t(ranks) / kMaxPeers;
  const std::uint64_t recv = align_up(std::uint64_t(c.rdma_recv), std::uint64_t(c.rdma_send));
  const std::uint64_t bytes = channels * rdma * (kMaxPeers * 2 + 2) * 2 * 4 +
                              channels * rdma * recv * 2 * (hidden_bytes + kRdmaSlotExtra);
  return align_up(bytes, 128);
}

}  // namespace

std::uint64_t deepep_nvl_buffer_bytes(int hidden_bytes, int ranks, int sms) {
  const TableRow* r = row_for(ranks);
  if (!r) return 0;
  return std::max(nvl_hint(std::uint64_t(hidden_bytes), ranks, sms, r->dispatch),
                  nvl_hint(std::uint64_t(hidden_bytes), ranks, sms, r->combine));
}

std::uint64_t deepep_rdma_buffer_bytes(int hidden_bytes, int ranks, int sms) {
  const TableRow* r = row_for(ranks);
  if (!r) return 0;
  return std::max(rdma_hint(std::uint64_t(hidden_bytes), ranks, sms, r->dispatch),
                  rdma_hint(std::uint64_t(hidden_bytes), ranks, sms, r->combine));
}

std::uint64_t nvshmem_granules(std::uint64_t bytes) {
  return bytes == 0 ? 0 : align_up(bytes, std::uint64_t(1) << 29);
}

std::uint64_t hybridep_buffer_bytes(int tokens_per_rank, int hidden, int ranks_per_node, int nodes,
                                    int experts_per_node) {
  const std::uint64_t per_rank = align_up(std::uint64_t(std::max(tokens_per_rank, 512)), 64);
  const std::uint64_t tokens = per_rank * std::uint64_t(ranks_per_node) * std::uint64_t(nodes);
  return tokens * std::uint64_t(hidden) * 2 + tokens * std::uint64_t(experts_per_node) * 4;
}

}  // namespace nodeemu
