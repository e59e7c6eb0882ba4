// What the transport layer was built with and what it can reach on this machine: library
// versions, UCX transports/devices and the CUDA/NCCL path. Printed by `trellis info`.
#pragma once

#include <string>
#include <vector>

namespace trellis::transport {

struct UcxResource {
  std::string component;  // UCT component, e.g. "tcp", "posix", "cma", "ib"
  std::string memory_domain;
  std::string transport;  // e.g. "tcp", "posix", "sysv", "cma", "rc_mlx5"
  std::string device;     // e.g. "eth0", "memory", "mlx5_0:1"
  std::string device_type;  // "net", "shm", "acc", "self"
};

struct CudaInfo {
  bool built = false;        // compiled with the CUDA/NCCL path
  std::string runtime;       // CUDA runtime version, "13.0"
  std::string driver;        // driver version or why it is absent ("no driver")
  int device_count = 0;      // visible GPUs (0 when none, with `why`)
  std::string nccl;          // NCCL version, "2.27.3"
  std::string why;           // when not built or not usable: the reason
};

struct LibraryReport {
  std::string mpi;
  std::string ucx;
  std::vector<UcxResource> ucx_resources;
  CudaInfo cuda;
};

// Queries the libraries. Never throws for a missing driver or device; says so in the report.
LibraryReport query_libraries();

}  // namespace trellis::transport
