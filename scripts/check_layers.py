#!/usr/bin/env python3
"""Checks that trident's headers depend only downwards, and that docs/ARCHITECTURE.md maps them.

Every header under include/trident/ belongs to the layer of its top folder; LAYERS lists them
lowest first. A header may include its own layer or a lower one, never a higher one; kernels
(.cuh) live in a cuda/ subfolder and are never included by host headers; every folder and every
header is named in docs/ARCHITECTURE.md; every host header (no "// trident-requires:" line, not
.cuh) is reachable from trident.hpp through includes, or trident.hpp says it "is left out". Run by ctest as packaging.layers; exits 1 on a problem.
A self-test on a made-up tree runs first, so a check that cannot fail fails.
"""
import os
import re
import sys
import tempfile

# One entry per top-level folder of include/trident/, in dependency order. A new folder must be
# placed here (and described in docs/ARCHITECTURE.md), or this check fails.
LAYERS = ["core", "exec", "launch", "comm", "model", "precision", "optim", "offload", "compress", "nn", "data", "parallel",
          "checkpoint", "plan"]
UMBRELLA = "trident.hpp"  # above everything
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*[<"](trident/[^">]+)[">]')


def layer_of(relative):
    """Layer index of a path relative to include/trident/ (the umbrella sits above all)."""
    if relative == UMBRELLA:
        return len(LAYERS)
    top = relative.split("/", 1)[0]
    return LAYERS.index(top) if top in LAYERS else None


def check(root, doc=None):
    """Returns the list of problems found in the tree include/trident under `root`."""
    base = os.path.join(root, "include", "trident")
    problems = []
    headers = []
    for directory, _, files in os.walk(base):
        for name in files:
            if name.endswith((".hpp", ".cuh")):
                headers.append(os.path.relpath(os.path.join(directory, name), base).replace(os.sep, "/"))
    for header in sorted(headers):
        own = layer_of(header)
        if own is None:
            problems.append(f"{header}: folder '{header.split('/')[0]}' is not a known layer; add it to LAYERS in "
                            f"scripts/check_layers.py (in dependency order) and to docs/ARCHITECTURE.md")
            continue
        parts = header.split("/")
        if header.endswith(".cuh") and "cuda" not in parts[:-1]:
            problems.append(f"{header}: CUDA kernels (.cuh) belong in their feature's cuda/ subfolder")
        with open(os.path.join(base, header), encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                m = INCLUDE_RE.match(line)
                if not m:
                    continue
                target = m.group(1)[len("trident/"):]
                if not os.path.exists(os.path.join(base, target)):
                    problems.append(f"{header}:{number}: includes trident/{target}, which does not exist")
                    continue
                theirs = layer_of(target)
                if theirs is None:
                    continue  # reported for that header itself
                if theirs > own:
                    problems.append(f"{header}:{number}: includes trident/{target}, from layer "
                                    f"'{target.split('/')[0]}' above its own layer '{parts[0]}' "
                                    f"(order: {' < '.join(LAYERS)})")
                if target.endswith(".cuh") and not header.endswith(".cuh"):
                    problems.append(f"{header}:{number}: a host header includes the CUDA kernel header trident/{target}")
    umbrella_problem = check_umbrella(base, headers)
    if umbrella_problem:
        problems.extend(umbrella_problem)
    if doc is not None:
        with open(doc, encoding="utf-8") as f:
            text = f.read()
        for layer in LAYERS:
            if os.path.isdir(os.path.join(base, layer)) and f"{layer}/" not in text:
                problems.append(f"docs/ARCHITECTURE.md does not describe the folder {layer}/")
        for header in headers:
            if header != UMBRELLA and header not in text:
                problems.append(f"docs/ARCHITECTURE.md does not mention {header}")
    return problems


def check_umbrella(base, headers):
    """Host headers that trident.hpp neither reaches through its includes nor says it leaves out."""
    umbrella = os.path.join(base, UMBRELLA)
    if not os.path.exists(umbrella):
        return []
    includes = {}
    for header in headers:
        with open(os.path.join(base, header), encoding="utf-8") as f:
            text = f.read()
        includes[header] = [m.group(1)[len("trident/"):] for m in map(INCLUDE_RE.match, text.splitlines()) if m]
    with open(umbrella, encoding="utf-8") as f:
        umbrella_text = f.read()
    reached, todo = set(), [UMBRELLA]
    while todo:
        h = todo.pop()
        for target in includes.get(h, []):
            if target not in reached:
                reached.add(target)
                todo.append(target)
    problems = []
    for header in sorted(headers):
        if header == UMBRELLA or header.endswith(".cuh") or header in reached:
            continue
        with open(os.path.join(base, header), encoding="utf-8") as f:
            top = "".join(f.readline() for _ in range(6))
        if "// trident-requires:" in top or f"{header} is left out" in umbrella_text:
            continue
        problems.append(f"{header}: a host header that trident.hpp does not include (add it there, or say "
                        f"in trident.hpp why it \"is left out\")")
    return problems


def self_test():
    """The check must catch an upward include, an unknown folder and a stray .cuh."""
    with tempfile.TemporaryDirectory() as root:
        base = os.path.join(root, "include", "trident")
        for d in ["core", "comm", "parallel/data", "mystery"]:
            os.makedirs(os.path.join(base, d))
        files = {
            "core/error.hpp": '#include "trident/core/config.hpp"\n',
            "core/config.hpp": "",
            "comm/communicator.hpp": '#include "trident/core/error.hpp"\n#include "trident/parallel/data/zero.hpp"\n',
            "parallel/data/zero.hpp": '#include "trident/comm/communicator.hpp"\n',
            "parallel/data/kernels.cuh": "",
            "mystery/thing.hpp": "",
            "core/forgotten.hpp": "",
            "core/gpu_only.hpp": "// trident-requires: nccl\n",
            "core/excluded.hpp": "",
            UMBRELLA: '#include "trident/comm/communicator.hpp"\n// core/excluded.hpp is left out: it needs a library\n',
        }
        for name, body in files.items():
            with open(os.path.join(base, name), "w", encoding="utf-8") as f:
                f.write(body)
        doc = os.path.join(root, "ARCHITECTURE.md")
        with open(doc, "w", encoding="utf-8") as f:
            f.write("core/ core/error.hpp core/config.hpp comm/ comm/communicator.hpp core/forgotten.hpp "
                    "core/gpu_only.hpp core/excluded.hpp\n")
        found = "\n".join(check(root, doc))
        expected = ["comm/communicator.hpp:2: includes trident/parallel/data/zero.hpp, from layer 'parallel' above",
                    "folder 'mystery' is not a known layer",
                    "parallel/data/kernels.cuh: CUDA kernels (.cuh) belong",
                    "does not describe the folder parallel/",
                    "does not mention parallel/data/zero.hpp",
                    "core/forgotten.hpp: a host header that trident.hpp does not include"]
        missing = [e for e in expected if e not in found]
        unexpected = ["core/error.hpp:", "parallel/data/zero.hpp:", "core/gpu_only.hpp:", "core/excluded.hpp:",
                      "core/config.hpp:"]
        if missing or any(u in found for u in unexpected):
            print("self-test failed; found:\n" + found + "\nmissing: " + repr(missing))
            return False
    return True


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if not self_test():
        return 1
    problems = check(root, os.path.join(root, "docs", "ARCHITECTURE.md"))
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} layering problem(s)")
        return 1
    print(f"layers ok: {' < '.join(LAYERS)} < trident.hpp")
    return 0


if __name__ == "__main__":
    sys.exit(main())
