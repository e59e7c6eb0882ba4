// The planner's cluster grammar (cluster_spec.hpp): short forms expanded, nvlink-domain and
// the catalog GPUs the topology layer does not know taken out of the spec it parses.
#include "trellis/sim/cluster_spec.hpp"

#include <fmt/format.h>

#include <map>
#include <set>
#include <vector>

#include "trellis/core/error.hpp"
#include "trellis/core/strings.hpp"
#include "trellis/sim/catalog.hpp"

namespace trellis::sim {
namespace {

// The fabrics of the short form, by suffix: NIC token of the synthetic grammar.
const std::map<std::string, std::string>& fabrics() {
  static const std::map<std::string, std::string> k = {{"ndr", "400g-ib"},       {"hdr", "200g-ib"},
                                                        {"roce100", "100g-roce"}, {"roce200", "200g-roce"},
                                                        {"roce400", "400g-roce"}, {"tcp", "100g-eth"}};
  return k;
}


// GB200 NVL72 rack: 18 compute trays of 4 GPUs in one 72-GPU NVLink domain; one 400G NIC
// (ConnectX-7) per GPU for the fabric between racks.
constexpr int kNvl72Trays = 18, kNvl72GpusPerTray = 4, kNvl72Domain = 72;

// "2x8xH100-NDR" -> a synthetic spec; "2xNVL72[-FABRIC]" -> 36 GB200 trays of 4 GPUs in
// NVLink domains of 72. Known fabrics: ndr, hdr, roce100/200/400, tcp.
std::string expand_shorthand(const std::string& text) {
  auto parts = split(text, 'x');
  const std::string valid = "use a synthetic spec (key=value,..., see `trellis topo --help`; trellis plan adds "
                            "nvlink-domain=N), HOSTSxGPUSxGPU[-FABRIC] such as 2x8xH100-NDR, or RACKSxNVL72[-FABRIC] "
                            "such as 1xNVL72 (GB200 NVL72), with FABRIC one of " +
                            fabric_names() + " and GPU one of " + device_names();
  // Strips a known fabric suffix off `name` into `nics` (count x rate-kind for `count` ports).
  auto take_fabric = [&](std::string& name, std::string& nics, const std::string& count) {
    for (const auto& [suffix, nic] : fabrics()) {
      const std::string s = "-" + suffix;
      if (to_lower(name).size() > s.size() && to_lower(name).ends_with(s)) {
        name = name.substr(0, name.size() - s.size());
        nics = (suffix == "tcp" ? "1x" : count + "x") + nic;
      }
    }
  };
  // An unknown suffix after a known device or NVL72: an unknown fabric, named as such.
  auto unknown_fabric = [&](const std::string& name) {
    const auto dash = name.rfind('-');
    if (dash == std::string::npos || dash == 0) return;
    const std::string head = name.substr(0, dash);
    bool known = to_lower(head) == "nvl72";
    try {
      find_device(head);
      known = true;
    } catch (const Error&) {
    }
    if (known)
      throw_error(ErrorCode::kNotFound, "unknown fabric '{}' in cluster '{}'; valid fabrics: {}", name.substr(dash + 1),
                  text, fabric_names());
  };
  if (parts.size() == 1 || parts.size() == 2) {  // [RACKSx]NVL72[-FABRIC]
    std::string rack = parts.back(), nics;
    take_fabric(rack, nics, std::to_string(kNvl72GpusPerTray));
    if (to_lower(rack) == "nvl72") {
      int racks = 1;
      try {
        if (parts.size() == 2) racks = static_cast<int>(parse_int(parts[0], "racks"));
      } catch (const Error& e) {
        throw_error(ErrorCode::kNotFound, "unknown cluster '{}' ({}); {}", text, e.what(), valid);
      }
      if (racks < 1) throw_error(ErrorCode::kInvalidArgument, "cluster '{}': racks must be >= 1", text);
      if (nics.empty()) nics = fmt::format("{}x400g-ib", kNvl72GpusPerTray);
      return fmt::format("hosts={},gpus={},gpu=GB200,nics={},nvlink-domain={}", racks * kNvl72Trays,
                         kNvl72GpusPerTray, nics, kNvl72Domain);
    }
    unknown_fabric(parts.back());
  }
  if (parts.size() != 3) throw_error(ErrorCode::kNotFound, "unknown cluster '{}'; {}", text, valid);
  std::string gpu = parts[2], nics;
  take_fabric(gpu, nics, parts[1]);
  if (nics.empty()) nics = parts[1] + "x400g-ib";
  try {
    gpu = find_device(gpu).name;
    parse_int(parts[0], "hosts");
    parse_int(parts[1], "gpus");
  } catch (const Error& e) {
    unknown_fabric(gpu);
    throw_error(ErrorCode::kNotFound, "unknown cluster '{}' ({}); {}", text, e.what(), valid);
  }
  if (gpu == "cpu") return fmt::format("hosts={}", parts[0]);
  return fmt::format("hosts={},gpus={},gpu={},nics={}", parts[0], parts[1], gpu == "H200" ? "H200-SXM" : gpu, nics);
}

// GPU models the topology layer's synthetic grammar knows (`trellis topo --help`).
bool topology_knows(const std::string& gpu) {
  for (const char* m : {"H100-SXM", "H200-SXM", "A100-SXM", "V100-SXM3", "V100-SXM2", "H100-PCIe", "A100-PCIe", "L40S"})
    if (to_lower(gpu) == to_lower(m)) return true;
  return false;
}

// A synthetic spec as the planner reads it: the topology's grammar plus `nvlink-domain=N`,
// and every GPU of sim's catalog. A catalog GPU the topology does not know (B200, GB200, H20,
// ...) is built on an H100-SXM host shape with its NVLink rate (or a PCIe H100 shape) and
// planned with its catalog figures (`device_override`, unless --gpu gave one).
std::string plan_spec(std::string spec, std::string& device_override, int& nvlink_domain) {
  std::vector<std::string> kept;
  bool has_nvlink_bw = false;
  std::string gpu;
  std::size_t gpu_at = 0;  // where the gpu= token was, to substitute in place
  for (const auto& token : split(spec, ',')) {
    const std::string t(trim(token));
    const auto eq = t.find('=');
    const std::string key = to_lower(trim(t.substr(0, eq)));
    const std::string value = eq == std::string::npos ? std::string() : std::string(trim(t.substr(eq + 1)));
    static const std::set<std::string> kKeys = {"hosts", "name",      "sockets", "numa",      "cores",
                                                "smt",   "mem",       "gpus",    "gpu",       "gpu-mem",
                                                "nvlink", "nvlink-bw", "nics",    "nvlink-domain"};
    if (!t.empty() && !kKeys.contains(key))
      throw_error(ErrorCode::kInvalidArgument,
                  "cluster spec '{}': unknown key '{}'; valid keys: hosts name sockets numa cores smt mem gpus gpu "
                  "gpu-mem nvlink nvlink-bw nics nvlink-domain (`trellis topo --help`; nvlink-domain=N: GPUs per "
                  "NVLink domain spanning hosts, e.g. 72 for GB200 NVL72)",
                  spec, key);
    if (key == "nvlink-domain") {
      nvlink_domain = static_cast<int>(parse_int(value, "nvlink-domain"));
      if (nvlink_domain < 1) throw_error(ErrorCode::kInvalidArgument, "nvlink-domain={}: must be >= 1", value);
      continue;
    }
    if (key == "nvlink-bw") has_nvlink_bw = true;
    if (key == "gpu" && !topology_knows(value)) {
      gpu = value;
      gpu_at = kept.size();
      kept.emplace_back();
      continue;
    }
    kept.push_back(t);
  }
  if (!gpu.empty()) {
    const DeviceSpec* d = nullptr;
    try {
      d = &find_device(gpu);
    } catch (const Error&) {
      std::string gpus;
      for (const auto& dev : device_catalog())
        if (dev.kind == DeviceKind::kGpu) gpus += (gpus.empty() ? "" : ", ") + dev.name;
      throw_error(ErrorCode::kNotFound, "synthetic spec: unknown gpu '{}'; valid GPUs: {}", gpu, gpus);
    }
    if (d->kind != DeviceKind::kGpu)
      throw_error(ErrorCode::kInvalidArgument, "synthetic spec: gpu={} is not a GPU (for CPU hosts leave gpus= out)",
                  gpu);
    const bool nvlink = d->intra_link.rfind("nvlink", 0) == 0;
    std::string& token = kept[gpu_at];
    token = nvlink ? "gpu=H100-SXM" : "gpu=H100-PCIe";
    if (nvlink && !has_nvlink_bw)
      token += fmt::format(",nvlink-bw={:g}GB", find_link(d->intra_link).bandwidth / 1e9);
    if (device_override.empty()) device_override = d->name;
  }
  std::string out;
  for (const auto& t : kept) out += (out.empty() ? "" : ",") + t;
  return out;
}

}  // namespace

std::string fabric_names() {
  std::string out;
  for (const auto& [k, v] : fabrics()) out += (out.empty() ? "" : ", ") + k;
  return out;
}

ClusterSpec parse_cluster_spec(std::string_view text, std::string device) {
  ClusterSpec out;
  const std::string t(text);
  out.synthetic = plan_spec(t.find('=') == std::string::npos ? expand_shorthand(t) : t, device, out.nvlink_domain);
  out.device = std::move(device);
  return out;
}

}  // namespace trellis::sim
