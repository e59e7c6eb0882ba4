// Link selection: which backend carries each link, from the link classes the placement
// found (topology/) and the user's overrides. The policy table (transport/README.md):
//
//   link class            CPU tensors   GPU tensors
//   same-process, shm     shm           nccl
//   nvlink, pcie          (GPU only)    nccl
//   rdma                  ucx           nccl
//   tcp                   ucx           nccl
//
// UCX runs RDMA (rc/dc/ud verbs) where the NIC offers it and TCP otherwise, so CPU links
// across hosts use ucx either way. Overrides (setting comm.transport, flag --transport):
// "NAME" for every link, or "CLASS=NAME[,CLASS=NAME...]" per link class; the per-class
// entries win over a global one. comm.no_nvlink (--no-nvlink) removes NVLink paths: the
// placement treats NVLink pairs as PCIe, and NCCL must run with NCCL_P2P_DISABLE=1, which
// launchers/ (the only code that touches the environment) sets from environment_for().
//
// Everything here is pure: no MPI, no sockets; `trellis topo` prints it before launch.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "trellis/core/config.hpp"
#include "trellis/topology/placement.hpp"
#include "trellis/transport/link.hpp"

namespace trellis::transport {

struct SelectionPolicy {
  std::optional<Backend> global;                       // --transport NAME
  std::map<topology::LinkClass, Backend> per_class;    // --transport CLASS=NAME
  bool no_nvlink = false;                              // --no-nvlink

  // Parses the comm.transport text ("auto", "ucx", "tcp=mpi,shm=tcp"); throws
  // kInvalidArgument naming the entry and the valid class and backend names.
  static SelectionPolicy parse(std::string_view transport, bool no_nvlink);
  // From the settings comm.transport and comm.no_nvlink.
  static SelectionPolicy from_config(const Config& config);
  // Back to text, for logs: "auto", "ucx", "tcp=mpi" (plus ", no-nvlink").
  std::string describe() const;
};

struct LinkChoice {
  topology::LinkClass link_class = topology::LinkClass::kSameProcess;
  Backend backend = Backend::kShm;
  bool overridden = false;  // chosen by --transport, not by the table
  std::string why;          // "policy: shm in a host", "--transport rdma=tcp"
};

// The table above, without overrides.
Backend default_backend(topology::LinkClass link_class, bool gpu_tensors);

// The backend for one link class. Throws kInvalidArgument when an override asks for what
// cannot work (shm across hosts, a CPU-only backend for GPU tensors, nccl for CPU
// tensors), naming the class and the backend.
LinkChoice choose_backend(topology::LinkClass link_class, bool gpu_tensors, const SelectionPolicy& policy);

// Backends for every TP group and stage boundary of a placement (indexed like
// Placement::tp_groups and Placement::boundaries).
struct LinkPlan {
  bool gpu_tensors = false;
  std::vector<LinkChoice> tp_groups;
  std::vector<LinkChoice> boundaries;
  std::vector<std::string> notes;  // e.g. "nccl is not built here: GPU links cannot run"
};
LinkPlan plan_links(const topology::Placement& placement, const SelectionPolicy& policy);

// The backend between two MPI ranks of a placement (same rank: shm for CPU, nccl for GPU).
LinkChoice choose_for_pair(const topology::Placement& placement, const topology::Topology& topo, int rank_a,
                           int rank_b, const SelectionPolicy& policy);

// Lines for `trellis topo` and the log line a run prints once at start:
//   TP group of stage 0   shm     -> shm  (policy: shm in a host)
//   stage 0 -> 1          tcp     -> ucx  (policy: ucx across hosts; RDMA where present)
std::string format_link_plan(const LinkPlan& plan);

// The options for a TP group's collective that honour an explicit --transport choice for
// the group's link class (`tp_group`, from plan_links): when comm.coll_algorithm is auto
// and the choice was overridden, the all-reduce runs over that backend too (mpi -> the MPI
// group, shm -> the shm group, ucx/tcp -> the ring over those links), so `--transport tcp`
// really sends the TP traffic over TCP. Otherwise (no override, an explicit algorithm, or
// nccl, which has no CPU collective here) `base` is returned unchanged.
struct GroupOptions;
GroupOptions follow_transport(GroupOptions base, const LinkChoice& tp_group);

// Environment variables a launcher must set before communication starts (name, value):
// NCCL_P2P_DISABLE=1 under --no-nvlink. Empty when nothing is needed.
std::vector<std::pair<std::string, std::string>> environment_for(const SelectionPolicy& policy);

}  // namespace trellis::transport
