// Entry point of the `trellis` executable: parses argv with CLI11, builds the Session and
// runs the chosen command. Exit codes: 0 success, 1 runtime failure, 2 usage error.
#pragma once

namespace trellis::launchers {

int run_cli(int argc, char** argv);

}  // namespace trellis::launchers
