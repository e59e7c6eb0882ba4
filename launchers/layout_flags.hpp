// The PP x TP layout flags of the commands that lay a model out over the world (`run`,
// `serve`, `eval ppl`), declared and checked in one place.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <string_view>

#include "session.hpp"

namespace trellis::launchers {

// Adds --pp (pipeline stages) and --tp (tensor-parallel ranks per stage), each a positive
// number shown with its default, writing into `pp` and `tp` (which must outlive parsing).
void add_layout_flags(CLI::App& sub, int& pp, int& tp);

// Adds --variant (a model variant name, core/variant.hpp) and --variant-layers A-B.
void add_variant_flags(CLI::App& sub, std::string& variant, std::string& layers);

// Adds --device auto|cpu|cuda (setting run.device; checked against the three names when
// parsed, the GPU itself before loading: runtime/engine/device.hpp), written into `device`
// as given (empty: not given), for apply_flag_settings.
void add_device_flag(CLI::App& sub, std::string& device);

// Whether the job has pp x tp ranks. When it has not, rank 0 logs once "--pp P x --tp T
// needs N ranks, this job has M: run it as mpirun -np N trellis COMMAND --pp P --tp T ..."
// and every rank gets false, so the command returns 1 everywhere (Session::require_world).
// `command` is how the user typed it: "run", "serve", "eval ppl".
bool check_layout(const Session& s, int pp, int tp, std::string_view command);

}  // namespace trellis::launchers
