#!/usr/bin/env python3
"""Fails when a layer includes a header of a layer above it or of a sibling.

    core < runtime < {ops, shmem, graph} < parallel < model < train < sim < cli

A file of src/<layer>/ or include/coremesh/<layer>/ (include/shmem.h belongs
to shmem) may include the headers of its own layer and of the layers below
it; ops, shmem and graph may not include one another; model, train and sim reach
SHMEM only through parallel (no coremesh/shmem include). Every quoted or angled
include is checked: "coremesh/<layer>/...", "shmem.h", and relative paths
("detail/launch.hpp", "../runtime/internal.hpp") resolved against the file.

    check_layering.py [ROOT]      exit 0: clean; 1: violations (listed); 2: usage
"""
import os
import re
import sys

RANK = {"core": 0, "runtime": 1, "ops": 2, "shmem": 2, "graph": 2,
        "parallel": 3, "model": 4, "train": 5, "sim": 6, "cli": 7}
ORDER = "core < runtime < {ops, shmem, graph} < parallel < model < train < sim < cli"
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^">]+)[">]')
SOURCE_SUFFIXES = (".h", ".hpp", ".c", ".cc", ".cpp")


def layer_of_path(rel):
    """Layer owning a path relative to ROOT, or None."""
    parts = rel.replace(os.sep, "/").split("/")
    if len(parts) >= 2 and parts[0] == "src" and parts[1] in RANK:
        return parts[1]
    if len(parts) >= 3 and parts[0] == "include" and parts[1] == "coremesh" and parts[2] in RANK:
        return parts[2]
    if parts == ["include", "shmem.h"]:
        return "shmem"
    return None


def layer_of_include(root, including_file, target):
    """Layer of an included header, or None for system and third-party headers."""
    if target.startswith("coremesh/"):
        name = target.split("/")[1]
        return name if name in RANK else None
    if target == "shmem.h":
        return "shmem"
    local = os.path.normpath(os.path.join(os.path.dirname(including_file), target))
    if os.path.exists(local):
        return layer_of_path(os.path.relpath(local, root))
    return None


# Layers that reach other PEs only through the parallel layer (its plan,
# seams and collectives), never SHMEM itself.
NO_SHMEM = {"model", "train", "sim"}


def allowed(source, target):
    if source == target:
        return True
    if source in NO_SHMEM and target == "shmem":
        return False
    return RANK[target] < RANK[source]


def violations(root):
    found = []
    for top in ("src", os.path.join("include", "coremesh"), "include"):
        base = os.path.join(root, top)
        if not os.path.isdir(base):
            continue
        for dirpath, _, files in os.walk(base):
            if top == "include" and dirpath != base:
                continue  # include/coremesh/ is walked on its own
            for name in sorted(files):
                if not name.endswith(SOURCE_SUFFIXES):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root)
                source = layer_of_path(rel)
                if source is None:
                    continue
                with open(path, encoding="utf-8", errors="replace") as f:
                    for number, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        target = layer_of_include(root, path, m.group(2))
                        if target is not None and not allowed(source, target):
                            kind = ("reached through parallel" if target == "shmem" and RANK[target] < RANK[source]
                                    else "a sibling" if RANK[target] == RANK[source] else "a higher layer")
                            found.append(f"{rel}:{number}: {source} includes {m.group(2)} "
                                         f"({target} is {kind})")
    return found


def main(argv):
    if len(argv) > 2:
        print(__doc__, file=sys.stderr)
        return 2
    root = os.path.abspath(argv[1] if len(argv) == 2 else os.path.join(os.path.dirname(__file__), ".."))
    found = violations(root)
    if found:
        print("\n".join(found))
        print(f"\n{len(found)} upward or sideways include(s). Layers depend one way: {ORDER}.\n"
              "HINT: move the shared code down to a layer both may include, or pass what the lower\n"
              "layer needs in through an interface it owns (a callback or a registry).")
        return 1
    print(f"layering: clean ({ORDER})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
