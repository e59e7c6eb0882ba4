#include "layout_flags.hpp"

#include <fmt/format.h>

namespace trellis::launchers {

void add_layout_flags(CLI::App& sub, int& pp, int& tp) {
  sub.add_option("--pp", pp, "Pipeline stages")->check(CLI::PositiveNumber)->capture_default_str();
  sub.add_option("--tp", tp, "Tensor-parallel ranks per stage")->check(CLI::PositiveNumber)->capture_default_str();
}

bool check_layout(const Session& s, int pp, int tp, std::string_view command) {
  return s.require_world(pp * tp == s.size(),
                         fmt::format("--pp {} x --tp {} needs {} ranks, this job has {}: run it as mpirun -np {} "
                                     "trellis {} --pp {} --tp {} ...",
                                     pp, tp, pp * tp, s.size(), pp * tp, command, pp, tp));
}

}  // namespace trellis::launchers
