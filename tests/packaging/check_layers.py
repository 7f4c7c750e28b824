#!/usr/bin/env python3
"""The runtime's layers, as runtime/README.md draws them:

- the folders that build the LibTorch-free libraries (data/, telemetry/, launch/,
  train/recovery_plan.* and the job store's dist/kv_*) never include LibTorch, directly or through a project header;
- every source file under runtime/src is named in runtime/README.md's map (its folder
  row), so the map cannot drift from the tree.
"""
import os
import re
import sys

ROOT = os.environ.get("EDIT_SOURCE_ROOT") or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SRC = os.path.join(ROOT, "runtime", "src")
INCLUDE_ROOTS = [SRC, os.path.join(ROOT, "common", "src")]
TORCH = re.compile(r'^\s*#\s*include\s*<(torch|ATen|c10)/', re.M)
LOCAL = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def resolve(inc, including):
    for d in [os.path.dirname(including)] + INCLUDE_ROOTS:
        p = os.path.join(d, inc)
        if os.path.isfile(p):
            return os.path.normpath(p)
    return None  # generated (protobuf) or system header: not ours


def torch_chain(path, seen=None):
    """The include chain from path to a LibTorch header, or None."""
    seen = set() if seen is None else seen
    if path in seen:
        return None
    seen.add(path)
    text = open(path).read()
    if TORCH.search(text):
        return [path]
    for inc in LOCAL.findall(text):
        p = resolve(inc, path)
        if p:
            chain = torch_chain(p, seen)
            if chain:
                return [path] + chain
    return None


def main():
    errors = []
    torch_free = []
    for folder in ("data", "telemetry", "launch"):
        d = os.path.join(SRC, folder)
        torch_free += [os.path.join(d, f) for f in sorted(os.listdir(d))]
    torch_free += [os.path.join(SRC, "train", f) for f in ("recovery_plan.h", "recovery_plan.cpp")]
    dist = os.path.join(SRC, "dist")
    torch_free += [os.path.join(dist, f) for f in sorted(os.listdir(dist)) if f.startswith("kv_")]
    for f in torch_free:
        chain = torch_chain(f)
        if chain:
            rel = [os.path.relpath(p, ROOT) for p in chain]
            errors.append("%s must not include LibTorch (its library does not link it): %s"
                          % (rel[0], " -> ".join(rel)))

    readme = open(os.path.join(ROOT, "runtime", "README.md")).read()
    rows = {}
    for line in readme.splitlines():
        m = re.match(r"\|\s*`([a-z_./]+)/`\s*\|(.*)", line)
        if m:
            rows[m.group(1)] = m.group(2)
    for dirpath, _, files in os.walk(SRC):
        folder = os.path.relpath(dirpath, SRC)
        for f in sorted(files):
            if folder == ".":
                if f != "torch_pch.h":
                    errors.append("runtime/src/%s: put it in a folder of the map (runtime/README.md)" % f)
                continue
            stem = f.rsplit(".", 1)[0]
            row = rows.get(folder)
            if row is None:
                errors.append("runtime/src/%s/ has no row in runtime/README.md's map" % folder)
                break
            if f not in row and ("`%s.*`" % stem) not in row:
                errors.append("runtime/src/%s/%s is not named in runtime/README.md's row for %s/"
                              % (folder, f, folder))
    for e in errors:
        print("FAIL " + e)
    if errors:
        return 1
    print("ok: %d LibTorch-free files; every runtime/src file is on the map" % len(torch_free))
    return 0


if __name__ == "__main__":
    sys.exit(main())
