#include "trellis/transport/libraries.hpp"

#include <ucp/api/ucp.h>
#include <uct/api/uct.h>

#include <vector>

#include "trellis/transport/bootstrap.hpp"

namespace trellis::transport {

CudaInfo query_cuda();  // cuda_info.cpp or cuda_info_none.cpp, chosen at configure time

namespace {

// Walks UCT components -> memory domains -> transport resources, the same inventory
// `ucx_info -d` prints.
std::vector<UcxResource> query_ucx_resources() {
  std::vector<UcxResource> out;
  uct_component_h* components = nullptr;
  unsigned num_components = 0;
  if (uct_query_components(&components, &num_components) != UCS_OK) return out;
  for (unsigned c = 0; c < num_components; ++c) {
    uct_component_attr_t attr{};
    attr.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME | UCT_COMPONENT_ATTR_FIELD_MD_RESOURCE_COUNT;
    if (uct_component_query(components[c], &attr) != UCS_OK) continue;
    std::vector<uct_md_resource_desc_t> mds(attr.md_resource_count);
    attr.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCES;
    attr.md_resources = mds.data();
    if (uct_component_query(components[c], &attr) != UCS_OK) continue;
    for (const auto& md_desc : mds) {
      uct_md_config_t* md_config = nullptr;
      if (uct_md_config_read(components[c], nullptr, nullptr, &md_config) != UCS_OK) continue;
      uct_md_h md = nullptr;
      ucs_status_t st = uct_md_open(components[c], md_desc.md_name, md_config, &md);
      uct_config_release(md_config);
      if (st != UCS_OK) continue;
      uct_tl_resource_desc_t* tls = nullptr;
      unsigned num_tls = 0;
      if (uct_md_query_tl_resources(md, &tls, &num_tls) == UCS_OK) {
        for (unsigned t = 0; t < num_tls; ++t) {
          const char* type = "?";
          switch (tls[t].dev_type) {
            case UCT_DEVICE_TYPE_NET: type = "net"; break;
            case UCT_DEVICE_TYPE_SHM: type = "shm"; break;
            case UCT_DEVICE_TYPE_ACC: type = "acc"; break;
            case UCT_DEVICE_TYPE_SELF: type = "self"; break;
            default: break;
          }
          out.push_back({attr.name, md_desc.md_name, tls[t].tl_name, tls[t].dev_name, type});
        }
        uct_release_tl_resource_list(tls);
      }
      uct_md_close(md);
    }
  }
  uct_release_component_list(components);
  return out;
}

}  // namespace

LibraryReport query_libraries() {
  LibraryReport r;
  r.mpi = mpi_library_version();
  r.ucx = ucp_get_version_string();
  r.ucx_resources = query_ucx_resources();
  r.cuda = query_cuda();
  return r;
}

}  // namespace trellis::transport
