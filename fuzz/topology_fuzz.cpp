// Fuzz entry for the topology readers (fuzz/build topology): the input is, by its first
// byte, an hwloc XML file read as `--topo-file` reads one (hwloc, then trellis's reader of
// hosts, NUMA nodes, cores, GPUs, NICs, PCIe paths and NVLink distances, in a child process), a topology JSON
// (`trellis topo --json` output read back) or a placement JSON. Any input must end in a
// value or a trellis::Error; a crash or a sanitizer report is a bug. An accepted topology or
// placement JSON must survive a write and a re-read unchanged.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "hwloc_reader.hpp"
#include "trellis/core/error.hpp"
#include "trellis/topology/placement.hpp"
#include "trellis/topology/topology.hpp"

namespace {

// Through the same isolated reader `--topo-file` uses: hwloc in a forked child, so hwloc's own
// crashes on malformed XML become errors; one of trellis's reader is kInternal, a finding.
void from_xml(std::string_view xml) {
  trellis::topology::detail::XmlSource src;
  src.buffer = std::string(xml);
  src.what = "fuzz XML";
  src.source = "xml:fuzz";
  src.deadline = std::chrono::milliseconds(15000);
  (void)trellis::topology::detail::host_from_xml_isolated(src);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace trellis::topology;
  if (size == 0 || size > (1 << 16)) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    switch (data[0] % 3) {
      case 0: from_xml(text); break;
      case 1: {
        const Topology t = topology_from_json_text(text, "fuzz topology JSON");
        const std::string once = to_json_text(t);
        if (to_json_text(topology_from_json_text(once, "re-read")) != once) {
          std::fprintf(stderr, "topology_fuzz: an accepted topology JSON changes when written and read back\n");
          std::abort();
        }
        break;
      }
      default: {
        const Placement p = placement_from_json_text(text, "fuzz placement JSON");
        const std::string once = placement_to_json_text(p);
        if (placement_to_json_text(placement_from_json_text(once, "re-read")) != once) {
          std::fprintf(stderr, "topology_fuzz: an accepted placement JSON changes when written and read back\n");
          std::abort();
        }
        break;
      }
    }
  } catch (const trellis::Error& e) {
    if (e.code() == trellis::ErrorCode::kInternal) {
      std::fprintf(stderr, "topology_fuzz: %s\n", e.what());
      std::abort();
    }
  }
  return 0;
}
