// The planner's cluster grammar: the topology layer's synthetic spec (`trellis topo --help`)
// extended with what planning needs and the topology layer does not model:
//  * `nvlink-domain=N`: every N consecutive GPUs (whole hosts) form one NVLink domain that
//    spans hosts, as a GB200 NVL72 rack (ClusterView::nvlink_domain);
//  * any GPU of sim's device catalog (`gpu=H20`, `gpu=GB200`, `gpu=B200`): one the topology
//    does not know is built on an H100-SXM host shape with its NVLink rate (or a PCIe H100
//    shape) and planned with its catalog figures;
//  * short forms: HOSTSxGPUSxGPU[-FABRIC] (`2x8xH100-NDR`, `2x8xH20-ROCE400`) and
//    [RACKSx]NVL72[-FABRIC] (`1xNVL72`: 18 trays of 4 GB200 in one 72-GPU NVLink domain, one
//    400G NIC per GPU).
// Unknown keys, GPUs and fabrics throw (kInvalidArgument / kNotFound) listing the valid names.
#pragma once

#include <string>
#include <string_view>

namespace trellis::sim {

struct ClusterSpec {
  std::string synthetic;   // the topology layer's synthetic spec (topology::parse_synthetic)
  std::string device;      // catalog device to plan with; empty: the one the topology reports
  int nvlink_domain = 0;   // GPUs per NVLink domain spanning hosts (set_nvlink_domain); 0: none
};

// `text`: a key=value spec or a short form. `device` (e.g. from --gpu) wins over the GPU the
// spec names.
ClusterSpec parse_cluster_spec(std::string_view text, std::string device = {});

// The short form's fabric suffixes ("hdr, ndr, roce100, ..."), for messages and help.
std::string fabric_names();

}  // namespace trellis::sim
