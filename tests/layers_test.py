#!/usr/bin/env python3
"""The libraries of mirage-onnx form layers: a module includes only headers of
the modules below it, and a private header (*_int.h) only from its own folder.

Reads every quoted #include of the tool's C sources, maps each header to the
folder that holds it, and checks the module graph against LAYERS. Exits 1
naming each include that runs back up (or sideways), or that reaches into
another module's private header. `--dot` prints the module graph as found, as
Graphviz text (the drawing the architecture issue asks for).

Tests and benchmarks (tests/, bench/) are white-box and may include anything.
"""
import argparse
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Each module and the modules it may include directly (lower layers); what
# those may include is allowed too. Keep in step with the CMake targets.
LAYERS = {
    "base": [],
    "onnx": ["base"],
    "tp": ["onnx"],                 # the tensor program: op table, TP IR, shapes
    "importer": ["tp"],             # ModelProto -> tensor program
    "partition": ["tp"],
    "exporter": ["onnx"],
    "superopt/mugraph": ["tp"],
    "superopt/verify": ["superopt/mugraph"],
    "superopt/absexpr": ["tp"],
    "superopt/search": ["superopt/verify", "superopt/absexpr"],
    "plugins": ["superopt/verify"],
    "fuse": ["plugins", "superopt/search", "partition", "exporter", "importer"],
    "cli": ["fuse"],
}
# Folders whose headers belong to a module (the plugins' runtime is embedded
# in every generated library; onnx.pb-c.h is generated into the build tree).
EXTRA_DIRS = {"plugins/runtime": "plugins"}
GENERATED = {"onnx.pb-c.h": "onnx"}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def closure(layers):
    """Every module a module may reach, itself included."""
    out = {}

    def reach(m, seen):
        for d in layers[m]:
            if d not in seen:
                seen.add(d)
                reach(d, seen)
        return seen

    for m in layers:
        out[m] = reach(m, {m})
    return out


def sources(root, module):
    d = os.path.join(root, module)
    for name in sorted(os.listdir(d)):
        if name.endswith((".c", ".h")):
            yield os.path.join(d, name)


def header_owners(root, layers):
    owners = dict(GENERATED)
    dirs = [(m, m) for m in layers] + list(EXTRA_DIRS.items())
    for folder, module in dirs:
        for name in os.listdir(os.path.join(root, folder)):
            if name.endswith(".h"):
                owners[name] = module
    return owners


def edges_of(root, layers):
    """(module, header, file, owner) for every quoted include."""
    owners = header_owners(root, layers)
    found = []
    for m in layers:
        for path in sources(root, m):
            with open(path, encoding="utf-8") as f:
                text = f.read()
            for h in INCLUDE.findall(text):
                found.append((m, h, os.path.relpath(path, root), owners.get(h)))
    return found


WHITE_BOX = {"tests", "bench", "models", "scripts", "onnx/generated"}


def unlisted_modules(root, layers):
    """Folders with C sources that LAYERS does not name: a new library must
    say where it sits."""
    out = []
    for dirpath, dirnames, files in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        dirnames[:] = [d for d in dirnames if not d.startswith((".", "build"))]
        if rel == "." or rel.split(os.sep)[0] in WHITE_BOX:
            continue
        if any(f.endswith((".c", ".h")) for f in files) and rel not in layers \
                and rel not in EXTRA_DIRS:
            out.append(f"{rel}: C sources in a folder tests/layers_test.py does not place")
    return out


def check(edges, layers):
    """The problems, one line each (empty when the layering holds)."""
    may = closure(layers)
    bad = []
    for m, h, path, owner in edges:
        if owner is None:
            bad.append(f"{path}: includes \"{h}\", which no module holds")
        elif owner not in may[m]:
            bad.append(f"{path}: includes \"{h}\" of {owner}, which {m} may not use "
                       f"(it is not below {m})")
        elif h.endswith("_int.h") and owner != m:
            bad.append(f"{path}: includes \"{h}\", private to {owner}")
    return bad


def self_test():
    """The checker itself refuses an upward, a sideways and a private edge."""
    layers = {"low": [], "mid": ["low"], "side": ["low"], "top": ["mid", "side"]}
    ok = [("top", "mid.h", "top/a.c", "mid"), ("mid", "low.h", "mid/a.c", "low")]
    assert check(ok, layers) == [], check(ok, layers)
    for e in [("low", "mid.h", "low/a.c", "mid"),          # up
              ("mid", "side.h", "mid/a.c", "side"),        # sideways
              ("top", "low_int.h", "top/a.c", "low"),      # private
              ("mid", "gone.h", "mid/a.c", None)]:         # unknown
        assert len(check(ok + [e], layers)) == 1, e


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dot", action="store_true", help="print the module graph (Graphviz)")
    a = ap.parse_args()
    self_test()
    edges = edges_of(ROOT, LAYERS)
    if a.dot:
        print("digraph layers {\n  rankdir=BT;")
        for m, o in sorted({(m, o) for m, _, _, o in edges if o and o != m}):
            print(f'  "{m}" -> "{o}";')
        print("}")
    bad = check(edges, LAYERS) + unlisted_modules(ROOT, LAYERS)
    for line in bad:
        print(line)
    n_cross = len({(m, o) for m, _, _, o in edges if o and o != m})
    print(f"{len(edges)} includes in {len(LAYERS)} modules, {n_cross} module edges, "
          f"{len(bad)} against the layering", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
