// One emulated GPU: its spec, streams, memory and worker pool.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "devices/buffer.hpp"
#include "devices/gpu_spec.hpp"
#include "devices/placement.hpp"
#include "devices/stream.hpp"

namespace nodeemu {

class Node;
class WorkerPool;

struct MemoryStats {
  std::uint64_t in_use = 0;  // now, in virtual time as far as the engine has got
  std::uint64_t peak = 0;    // over the virtual timeline so far
  std::uint64_t capacity = 0;
};

class Device {
 public:
  int id() const { return placement_.device; }
  int node_index() const { return placement_.node; }
  int local_index() const { return placement_.local; }
  const GpuSpec& spec() const { return *spec_; }
  const DevicePlacement& placement() const { return placement_; }
  std::string name() const;

  Stream default_stream() { return streams_.front(); }
  Stream create_stream(Priority p = Priority::Normal, std::string name = "");
  // The device's stream called `name`, made (at priority `p`) on first use: one side stream that
  // every user on this device shares, as a class attribute does in PyTorch (the MoE dispatcher's
  // cuda_dtoh_stream).
  Stream shared_stream(const std::string& name, Priority p = Priority::Normal);
  const std::vector<Stream>& streams() const { return streams_; }

  // Device memory, accounted against the emulated HBM in both modes and placed on the real NUMA
  // node that stands for the GPU's socket in functional mode. Throws OutOfMemory naming the
  // device, the size asked for, the size in use and the capacity. Zero-filled.
  Buffer allocate(std::size_t bytes, std::vector<std::int64_t> shape = {});
  // The same without the zero-fill, for memory the caller overwrites before reading (a copy's
  // destination). Its contents are unspecified. `pool_stream`: the stream it is allocated for,
  // as an allocation inside `with torch.cuda.stream(s)` takes its block from s's pool (a
  // reload's destination on the H2D stream); by default the device's compute stream.
  Buffer allocate_uninitialized(std::size_t bytes, std::vector<std::int64_t> shape = {},
                                const Stream* pool_stream = nullptr);
  // Device memory that is accounted like any other but has no contents in either mode: the
  // workspace of a library whose bytes the emulation never reads or writes (DeepEP's and
  // HybridEP's persistent buffers). Its data() throws, as a meta buffer's does.
  Buffer reserve(std::size_t bytes);
  // Zero-filled memory with contents (in functional mode) that lives inside such a reservation,
  // so it is not accounted again: the rows a library keeps in its persistent buffer (HybridEP's
  // received tokens in its sync-free mode). The caller keeps the reservation at least as large.
  Buffer workspace(std::size_t bytes);
  MemoryStats memory() const;
  // The peak over a window of virtual time (seconds): e.g. one phase of a step.
  std::uint64_t peak_memory(double from_s, double to_s) const;
  // Host memory of the process that drives this GPU, on its NUMA node (placement().process_numa):
  // where its pinned staging buffers live.
  Buffer allocate_host(std::size_t bytes, bool pinned = true);

  void synchronize();
  WorkerPool& pool() const { return *pool_; }
  Node& node() const { return *node_; }

  // Internal: built by Node.
  Device(Node* node, DevicePlacement placement, const GpuSpec* spec, WorkerPool* pool);

 private:
  Buffer allocate_impl(std::size_t bytes, std::vector<std::int64_t> shape, bool zeroed, bool meta,
                       const Stream* pool_stream, bool accounted = true);
  Node* node_;
  DevicePlacement placement_;
  const GpuSpec* spec_;
  WorkerPool* pool_;
  std::vector<Stream> streams_;
};

}  // namespace nodeemu
