#include "cli.hpp"

int main(int argc, char** argv) { return trellis::launchers::run_cli(argc, argv); }
