// The typed exceptions that NodeEmu throws at its API boundaries (Error and ConfigError, their
// root, are in schema/errors.hpp). Every message is one line that
// names the file, key, device or operation involved and says what to do about it.
#pragma once

#include <cstdint>
#include <string>

#include "schema/errors.hpp"

namespace nodeemu {

// An allocation that does not fit the emulated device's memory.
class OutOfMemory : public Error {
 public:
  OutOfMemory(int device, std::uint64_t requested, std::uint64_t in_use, std::uint64_t capacity);
  int device() const { return device_; }
  std::uint64_t requested() const { return requested_; }
  std::uint64_t in_use() const { return in_use_; }
  std::uint64_t capacity() const { return capacity_; }

 private:
  int device_;
  std::uint64_t requested_, in_use_, capacity_;
};

// A kernel body threw. It poisons its stream (sticky, as a CUDA error is) and comes back to the
// host at the next synchronize that covers the stream.
class KernelError : public Error {
 public:
  KernelError(int device, std::string stream, std::string kernel, const std::string& cause);
  int device() const { return device_; }
  const std::string& stream() const { return stream_; }
  const std::string& kernel() const { return kernel_; }

 private:
  int device_;
  std::string stream_, kernel_;
};

// The host machine could not do what was asked: a NUMA node that does not exist, a binding
// that failed, a bad synthetic topology string.
class HostError : public Error {
 public:
  using Error::Error;
};

// The API was used in a way the emulated hardware cannot honour (for example a stream of one
// device waiting in another device's host program).
class UsageError : public Error {
 public:
  using Error::Error;
};

// Work that can never complete: every host is blocked and nothing is left to run.
class DeadlockError : public Error {
 public:
  using Error::Error;
};

}  // namespace nodeemu
