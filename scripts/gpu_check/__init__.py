"""The pieces of scripts/gpu-check: common (paths, ldd, processes), pack (here), run (on the GPU machine)."""
