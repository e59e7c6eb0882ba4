#include "layout_flags.hpp"

#include <fmt/format.h>

namespace trellis::launchers {

void add_layout_flags(CLI::App& sub, int& pp, int& tp) {
  sub.add_option("--pp", pp, "Pipeline stages")->check(CLI::PositiveNumber)->capture_default_str();
  sub.add_option("--tp", tp, "Tensor-parallel ranks per stage")->check(CLI::PositiveNumber)->capture_default_str();
}

void add_variant_flags(CLI::App& sub, std::string& variant, std::string& layers) {
  sub.add_option("--variant", variant,
                 "Model variant: standard, parallel, ladder, desync2, desync4, lp, nocomm (see docs/variants.md)")
      ->capture_default_str();
  sub.add_option("--variant-layers", layers, "Layers A-B (inclusive) the variant applies to; default all");
}

void add_device_flag(CLI::App& sub, std::string& device) {
  sub.add_option("--device", device,
                 "Compute on: auto (a GPU when every rank sees one), cpu, or cuda (refused before loading without a "
                 "GPU); setting run.device")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
}

bool check_layout(const Session& s, int pp, int tp, std::string_view command) {
  return s.require_world(pp * tp == s.size(),
                         fmt::format("--pp {} x --tp {} needs {} ranks, this job has {}: run it as mpirun -np {} "
                                     "trellis {} --pp {} --tp {} ...",
                                     pp, tp, pp * tp, s.size(), pp * tp, command, pp, tp));
}

}  // namespace trellis::launchers
