#include "devices/errors.hpp"

#include "devices/units.hpp"

namespace nodeemu {

OutOfMemory::OutOfMemory(int device, std::uint64_t requested, std::uint64_t in_use,
                         std::uint64_t capacity)
    : Error("out of memory on device " + std::to_string(device) + ": asked for " +
            format_bytes(requested) + " with " + format_bytes(in_use) + " in use of " +
            format_bytes(capacity) +
            "; free buffers earlier, offload activations, or use a GPU with more HBM"),
      device_(device),
      requested_(requested),
      in_use_(in_use),
      capacity_(capacity) {}

KernelError::KernelError(int device, std::string stream, std::string kernel,
                         const std::string& cause)
    : Error("kernel '" + kernel + "' failed on device " + std::to_string(device) + " stream '" +
            stream + "': " + cause),
      device_(device),
      stream_(std::move(stream)),
      kernel_(std::move(kernel)) {}

}  // namespace nodeemu
