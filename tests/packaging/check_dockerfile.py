#!/usr/bin/env python3
"""Static checks of the Dockerfile (no container engine runs in CI): the stages and the
runtime/operator targets exist, every COPY source is in the repository and not excluded by
.dockerignore, dependencies come from scripts/install-deps.sh (--build in the build,
--runtime / --operator in the images, and the operator's list holds no LibTorch), the
images do not derive from a build stage, they hold the binaries their build stage makes,
build stages copy sources only after installing dependencies (a cached layer), and the
images run as a non-root user. scripts/build-images.sh builds them for real (ctest -L image)."""
import fnmatch
import re
import shlex

from common import ROOT, fail

FINAL = {"runtime": ["edit-train", "edit-run", "edit-data", "edit-export"], "operator": ["edit-operator"]}
MODE = {"runtime": "--runtime", "operator": "--operator"}
SCRIPT = "install-deps.sh"


def script_list(name):
    """The packages of a bash array NAME=(...) in scripts/install-deps.sh."""
    text = (ROOT / "scripts" / SCRIPT).read_text()
    m = re.search(r"^%s=\(([^)]*)\)" % re.escape(name), text, re.M)
    return m.group(1).split() if m else None


def instructions(text):
    """[(INSTRUCTION, arguments)] with line continuations joined and comments dropped."""
    out, buf = [], ""
    for line in text.splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        buf += line
        word, _, rest = buf.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    return out


def stages(instrs):
    """(global ARGs, [{name, base, instrs}]) in file order."""
    args, result = {}, []
    for word, rest in instrs:
        if word == "FROM":
            m = re.fullmatch(r"(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?", rest, re.I)
            result.append({"base": m.group(1), "name": (m.group(2) or str(len(result))).lower(), "instrs": []})
        elif not result:
            if word == "ARG":
                k, _, v = rest.partition("=")
                args[k] = v
        else:
            result[-1]["instrs"].append((word, rest))
    return args, result


def ignored(path, patterns):
    """Whether .dockerignore patterns exclude path (the last match wins, '!' re-includes)."""
    hit = False
    for p in patterns:
        neg = p.startswith("!")
        p = p.lstrip("!").strip("/")
        candidates = [p] + ([p[3:], "*/" + p[3:]] if p.startswith("**/") else [])
        if any(fnmatch.fnmatch(path, c) or fnmatch.fnmatch(path, c + "/*") for c in candidates):
            hit = not neg
    return hit


def main():
    problems = []
    text = (ROOT / "Dockerfile").read_text()
    patterns = [l.strip() for l in (ROOT / ".dockerignore").read_text().splitlines()
                if l.strip() and not l.startswith("#")] if (ROOT / ".dockerignore").exists() else []
    args, st = stages(instructions(text))
    names = [s["name"] for s in st]
    by_name = {s["name"]: s for s in st}

    if args.get("BASE") != "debian:bookworm":
        problems.append(f"ARG BASE must default to debian:bookworm, is {args.get('BASE')!r}")
    if "EDIT_WITH_CUDA" not in text:
        problems.append("no EDIT_WITH_CUDA build argument for the CUDA build")
    for target in FINAL:
        if target not in by_name:
            problems.append(f"no stage '{target}' (docker build --target {target})")

    for i, s in enumerate(st):
        if s["base"].lower() not in names[:i] and s["base"] != "${BASE}" and ":" not in s["base"]:
            problems.append(f"stage {s['name']}: base {s['base']} is neither an earlier stage, ${{BASE}} nor a tagged image")
        for word, rest in s["instrs"]:
            if word not in ("COPY", "ADD"):
                continue
            parts = shlex.split(rest)
            flags = [p for p in parts if p.startswith("--")]
            paths = [p for p in parts if not p.startswith("--")]
            frm = [f.split("=", 1)[1] for f in flags if f.startswith("--from=")]
            if word == "ADD":
                problems.append(f"stage {s['name']}: use COPY, not ADD")
            if frm:
                if frm[0].lower() not in names[:i]:
                    problems.append(f"stage {s['name']}: COPY --from={frm[0]} is not an earlier stage")
                continue
            for src in paths[:-1]:
                rel = src.strip("/") or "."
                if not (ROOT / rel).exists():
                    problems.append(f"stage {s['name']}: COPY source {src} does not exist in the repository")
                elif rel != "." and ignored(rel, patterns):
                    problems.append(f"stage {s['name']}: COPY source {src} is excluded by .dockerignore")

    runs = {s["name"]: " ".join(r for w, r in s["instrs"] if w == "RUN") for s in st}
    full = [n for n, r in runs.items() if re.search(SCRIPT + r"\s+--build(\s|&|;|$)", r)]
    if not full:
        problems.append(f"no build stage runs scripts/{SCRIPT} --build (the dependency script of README and CI)")
    operator_pkgs = script_list("operator_pkgs")
    if operator_pkgs is None:
        problems.append(f"scripts/{SCRIPT} has no operator_pkgs list (--operator)")
    elif any("torch" in p for p in operator_pkgs):
        problems.append(f"scripts/{SCRIPT} --operator installs LibTorch: {operator_pkgs}")
    # A build stage's sources must come after its dependencies: COPY of sources in the
    # stage that installs them would rebuild the dependency layer on every edit.
    for s in st:
        seen_source_copy = False
        for word, rest in s["instrs"]:
            if word == "COPY" and "--from=" not in rest and SCRIPT not in rest:
                seen_source_copy = True
            if word == "RUN" and re.search(SCRIPT + r"\s+--build", rest) and seen_source_copy:
                problems.append(f"stage {s['name']}: sources are copied before {SCRIPT} --build runs")
    if not any(re.search(r"cmake\s.*-G\s*Ninja", r) for r in runs.values()):
        problems.append("no stage configures the build with cmake -G Ninja")

    for target, binaries in FINAL.items():
        s = by_name.get(target)
        if not s:
            continue
        chain, base = [target], s["base"].lower()
        while base in by_name:
            chain.append(base)
            base = by_name[base]["base"].lower()
        if len(chain) > 1:
            problems.append(f"{target}: derives from build stage(s) {chain[1:]}; start from the base image")
        if not re.search(SCRIPT + r"\s+" + MODE[target] + r"(\s|&|;|$)", runs[target]):
            problems.append(f"{target}: must install its libraries with {SCRIPT} {MODE[target]}")
        if re.search(r"build-essential|cmake|ninja", runs[target]):
            problems.append(f"{target}: installs build tools")
        users = [r for w, r in s["instrs"] if w == "USER"]
        if not users:
            problems.append(f"{target}: no USER (runs as root)")
        elif users[-1].split(":")[0] in ("root", "0", ""):
            problems.append(f"{target}: final USER {users[-1]} is root")
        made_by = {}  # binary -> the stage it is copied from
        for w, r in s["instrs"]:
            parts = shlex.split(r)
            frm = [p.split("=", 1)[1] for p in parts if p.startswith("--from=")]
            if w == "COPY" and frm:
                for src in [p for p in parts if not p.startswith("--")][:-1]:
                    made_by[src.rsplit("/", 1)[-1]] = frm[0].lower()
        for b in binaries:
            if b not in made_by:
                problems.append(f"{target}: does not copy {b} from a build stage")
            elif not re.search(rf"--target\s[^&;]*\b{re.escape(b)}\b", runs.get(made_by[b], "")):
                problems.append(f"{target}: stage {made_by[b]} does not build {b} (--target)")
    fail(problems, "dockerfile")


if __name__ == "__main__":
    main()
