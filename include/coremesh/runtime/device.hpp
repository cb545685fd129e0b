// Device: a set of compute cores shared by every stream created on it.
//
// On the CPU backend a core is a worker thread (pinned to one CPU of the
// affinity mask when the mask has enough CPUs). The spec says how many
// "cube" (matrix) and "vector" (element-wise) cores the device offers; on the
// CPU both default to the number of workers. Core limits cap how many blocks
// of a kernel may be used; they resolve stream limit > device limit > spec,
// like CANN's aclrtGetResInCurrentThread.
//
// Thread safety: every public method may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>

namespace coremesh::runtime {

class Stream;

enum class KernelKind : uint8_t { cube, vector, mixed, comm };
std::string_view kernel_kind_name(KernelKind kind);

// Numbers of cores, as the RFC's {'cube_core_num', 'vector_core_num'}.
struct CoreLimits {
  int cube = 0;
  int vector = 0;
  bool operator==(const CoreLimits&) const = default;
};

// The most blocks a kernel of `kind` may use under `limits`: cube -> cube,
// vector and comm -> vector (one-sided communication runs on vector cores),
// mixed -> min(cube, vector).
int max_blocks(const CoreLimits& limits, KernelKind kind);

struct DeviceOptions {
  int cores = 0;         // worker threads; 0: COREMESH_CORES, else the affinity mask size
  int cube_cores = 0;    // spec; 0: same as cores
  int vector_cores = 0;  // spec; 0: same as cores
  bool pin = true;       // pin workers to CPUs when the affinity mask allows (COREMESH_PIN=0: never)
  // Spin this long before a worker or host wait sleeps; -1: COREMESH_SPIN_US
  // (default 50). 0 suits many processes sharing few CPUs.
  int spin_us = -1;
};

class Device {
 public:
  explicit Device(const DeviceOptions& options = {});
  ~Device();  // waits for all work, then stops the workers
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  // The process-wide device, created on first use from the environment.
  static Device& default_device();

  int id() const;
  int num_cores() const;
  CoreLimits spec() const;

  // Device (process) limit. -1 leaves a kind as it is; 0, values below -1
  // and values above the spec are rejected with InvalidArgument.
  void set_limit(int cube_num = -1, int vector_num = -1);
  void reset_limit();
  // The device limit in force: the device limit where set, else the spec.
  CoreLimits limit() const;

  Stream& default_stream();
  // Blocks until every stream of this device is idle; rethrows the first
  // kernel error found.
  void synchronize();

  struct Impl;
  Impl& impl() const { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

// The RFC's names (ms.runtime.set_device_limit / get_device_limit).
void set_device_limit(Device& device, int cube_num = -1, int vector_num = -1);
CoreLimits get_device_limit(const Device& device);
void reset_device_limit(Device& device);

}  // namespace coremesh::runtime
