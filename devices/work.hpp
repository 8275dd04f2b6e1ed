// What a device operation asks of the hardware. The timing plane costs an operation from this
// description alone, in both run modes, so a meta run and a functional run of the same program
// give the same virtual timeline.
#pragma once

#include <functional>
#include <string>

#include "devices/buffer.hpp"
#include "devices/kernel_shape.hpp"
#include "devices/small_vector.hpp"

namespace nodeemu {

enum class Mode { Functional, Meta };

// CUDA stream priorities, as an ordering: High runs first when kernels compete for SMs.
enum class Priority : int { Low = -1, Normal = 0, High = 1 };

enum class Precision { BF16, FP8, FP32 };

// Which pass of the framework a host is issuing in (FrameworkScope, host.hpp).
enum class FrameworkPass : int { None = 0, Forward = 1, Backward = 2 };

struct Work {
  double flops = 0;  // floating-point operations
  double bytes = 0;  // HBM traffic, read + write
  int sms = 0;       // SMs a communication kernel holds while it runs; 0 = a compute
                     // kernel that spreads over whatever SMs are free
  Precision precision = Precision::BF16;
  double fixed_s = 0;  // an explicit duration at full device (tests, the demo); overrides
                       // the shape, flops and bytes when > 0
  // What the kernel is, for the GPU profile's tables (kernel_shape.hpp). A kernel without a shape
  // is priced by the roofline over `flops` and `bytes` and reported as unpriced.
  KernelShape shape;
};

// The buffers a kernel uses, inline up to six: a model step launches millions of kernels, and a
// heap list each was one allocation per launch.
using KernelBuffers = boost::container::small_vector<Buffer, 6>;

struct Kernel {
  std::string name;
  Work work;
  // The functional body; runs on the device's worker pool, skipped in meta mode. Capture raw
  // pointers (buffer.data()), never Buffer handles: list the buffers in `uses` instead, which
  // keeps them alive until the kernel has completed on both planes.
  std::function<void()> body;
  KernelBuffers uses;
};

}  // namespace nodeemu
