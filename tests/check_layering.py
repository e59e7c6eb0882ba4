#!/usr/bin/env python3
"""Fails if a layer includes a header of a layer it may not depend on (DESIGN.md).

Layers point down only: launchers -> serve -> runtime -> transport -> topology -> core;
kernels -> core; sim -> topology, core. Checked on #include "trellis/<layer>/..." lines.
"""
import pathlib
import re
import sys

ALLOWED = {
    "core": set(),
    "kernels": {"core"},
    "topology": {"core"},
    "sim": {"core", "topology"},
    "transport": {"core", "topology"},
    "runtime": {"core", "kernels", "topology", "transport"},
    "serve": {"core", "runtime"},
    "launchers": {"core", "kernels", "topology", "transport", "runtime", "sim", "serve"},
}
INCLUDE = re.compile(r'#\s*include\s*[<"]trellis/(\w+)/')

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")
bad = []
for layer, allowed in ALLOWED.items():
    for f in sorted((root / layer).rglob("*")):
        if f.suffix not in {".hpp", ".cpp", ".h", ".cu", ".cuh"}:
            continue
        for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
            m = INCLUDE.search(line)
            if m and m.group(1) != layer and m.group(1) not in allowed:
                bad.append(f"{f.relative_to(root)}:{n}: {layer}/ may not include trellis/{m.group(1)}/")
for b in bad:
    print(b)
print(f"layering: {len(bad)} violation(s)")
sys.exit(1 if bad else 0)
