#!/usr/bin/env python3
"""Container images: build them (scripts/build-images.sh), run their checks (ctest -L
image) and write what came out: bench/results/<date>/images.md and images.json.

    python3 bench/images.py [--out DIR] [--build-dir build] [--skip-build] [--cold-log FILE]

The report holds each image's size and its layers (largest first, with the Dockerfile
step that made each), the build's wall time and how many steps came from the layer
cache, each check's result and time, and the lines the checks printed (the 2-worker
training run inside the runtime image, the EDiTJob run in it on the API stand-in).
Needs root (Buildah's chroot isolation) and a configured build tree (make build).
"""
import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
IMAGES = ["localhost/edit-runtime:latest", "localhost/edit-operator:latest"]


def human(n):
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return "%.0f %s" % (n, unit) if unit in ("B", "kB") else "%.2f %s" % (n, unit)
        n /= 1000.0
    return str(n)


def step_name(created_by):
    """A layer's Dockerfile step, short: COPY sources are content hashes, say where to."""
    s = re.sub(r"\s+", " ", created_by).strip()
    s = re.sub(r"^/bin/sh -c #\(nop\) COPY (?:multi|file|dir):[0-9a-f]+ in (\S+)", r"COPY ... \1", s)
    s = re.sub(r"^/bin/sh -c ", "RUN ", s)
    return "(the base image)" if s == "/bin/sh" else s


def image_info(ref):
    """(id, total bytes, [(bytes, created_by)]) from Buildah's local storage."""
    res = subprocess.run(["buildah", "inspect", "--type", "image", ref], capture_output=True, text=True)
    if res.returncode != 0:
        return None
    info = json.loads(res.stdout)
    manifest = json.loads(info.get("Manifest") or "{}")
    sizes = [l.get("size", 0) for l in manifest.get("layers") or []]
    history = [h for h in (info.get("OCIv1") or {}).get("history") or [] if not h.get("empty_layer")]
    steps = [step_name(h.get("created_by", "")) for h in history]
    if len(steps) != len(sizes):
        steps = [""] * len(sizes)
    return info.get("FromImageID", ""), sum(sizes), list(zip(sizes, steps))


def build_summary(log, seconds=None):
    """Per-image build seconds, steps and cached steps from scripts/build-images.sh's output."""
    per = {m.group(1): int(m.group(2)) for m in re.finditer(r"build-images: (\S+) built in (\d+) s", log)}
    return {"seconds": seconds if seconds is not None else sum(per.values()), "per_image": per,
            "steps": len(re.findall(r"^\[\d+/\d+\] STEP|^STEP \d+", log, re.M)),
            "cached": log.count("Using cache"),
            "base_made": "made localhost/debian:bookworm" in log}


def run_checks(build_dir):
    """ctest -L image: [(name, status, seconds)], the output."""
    res = subprocess.run(["ctest", "-V", "-L", "image", "--timeout", "900"], cwd=build_dir,
                         capture_output=True, text=True)
    out = res.stdout + res.stderr
    rows = []
    for m in re.finditer(r"Test\s+#\d+: (\S+) \.+\**\s*(Passed|Failed|\*\*\*Failed|Not Run|\*\*\*Skipped|Skipped|\*\*\*Timeout|\*\*\*Exception[^\d]*)\s+([\d.]+) sec", out):
        rows.append((m.group(1), m.group(2).strip("* "), float(m.group(3))))
    return rows, out, res.returncode


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", datetime.date.today().isoformat()))
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build"))
    ap.add_argument("--skip-build", action="store_true", help="report on the images as they are")
    ap.add_argument("--cold-log", help="the output of an earlier scripts/build-images.sh run "
                                       "(e.g. the first, cold one) to report as well")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    build = {}
    if not args.skip_build:
        t0 = time.monotonic()
        res = subprocess.run([os.path.join(ROOT, "scripts", "build-images.sh")], capture_output=True, text=True)
        log = res.stdout + res.stderr
        build = build_summary(log, round(time.monotonic() - t0, 1))
        if res.returncode != 0:
            sys.stderr.write(log[-5000:])
            sys.exit("images: scripts/build-images.sh failed")
    cold = None
    if args.cold_log:
        with open(args.cold_log, errors="replace") as f:
            cold = build_summary(f.read())
    images = {}
    for ref in IMAGES:
        got = image_info(ref)
        if got is None:
            sys.exit("images: %s is not built (scripts/build-images.sh)" % ref)
        images[ref] = {"id": got[0], "bytes": got[1], "layers": got[2]}
    checks, out, code = run_checks(args.build_dir)
    printed = [m.group(1) for m in re.finditer(r"((?:2-worker edit-run|job) in \S+ .*)", out)]
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()

    lines = ["# Container images (%s, commit %s)" % (datetime.date.today().isoformat(), commit), "",
             "`python3 bench/images.py`: `scripts/build-images.sh` (Buildah %s, chroot isolation, "
             "base `localhost/debian:bookworm` from `debootstrap --variant=minbase`), then "
             "`ctest -L image` (tests/images/test_images.py, the e2e case "
             "`ImageRuntime.test_job_in_runtime_image`). 2 shared cores." % subprocess.run(
                 ["buildah", "--version"], capture_output=True, text=True).stdout.split()[2], ""]
    for what, b in (("Cold build (%s)" % os.path.basename(args.cold_log or ""), cold), ("Build", build)):
        if b:
            lines += ["%s: %.0f s wall (%s), %d of %d steps from the layer cache%s." % (
                what, b["seconds"], ", ".join("%s %d s" % kv for kv in b["per_image"].items()),
                b["cached"], b["steps"], "; the debootstrap base made first" if b["base_made"] else ""), ""]
    lines += ["| image | ID | size (uncompressed layers) |", "| --- | --- | --- |"]
    for ref, im in images.items():
        lines.append("| `%s` | `%s` | %s |" % (ref, im["id"][:12], human(im["bytes"])))
    for ref, im in images.items():
        lines += ["", "Layers of `%s`, largest first:" % ref, "", "| size | step |", "| --- | --- |"]
        for size, step in sorted(im["layers"], key=lambda x: -x[0])[:6]:
            step = step.replace("|", "\\|")
            lines.append("| %s | `%s` |" % (human(size), (step[:110] + "...") if len(step) > 110 else step))
    lines += ["", "Checks (`ctest -L image`, exit %d):" % code, "", "| test | result | seconds |",
              "| --- | --- | --- |"]
    for name, status, secs in checks:
        lines.append("| %s | %s | %.1f |" % (name, status, secs))
    if printed:
        lines += ["", "What the checks printed:", ""] + ["    " + p for p in printed]
    slowest = max([b["seconds"] for b in (cold, build) if b] or [0])
    lines += ["", "Not part of `make test` (CI: `.ci/run`, about 17 min of its ~45 min budget on 2 cores): "
              "a build from nothing took %.0f min here and needs Debian's mirror during the build; "
              "the checks alone take %.0f s once the images exist, but images left on a machine may "
              "be stale. `make images` builds and checks them." % (slowest / 60.0, sum(t for _, _, t in checks))]
    with open(os.path.join(args.out, "images.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(args.out, "images.json"), "w") as f:
        json.dump({"commit": commit, "build": build, "cold_build": cold, "images": images,
                   "checks": [{"name": n, "status": s, "seconds": t} for n, s, t in checks],
                   "printed": printed}, f, indent=1)
    print("\n".join(lines))
    sys.exit(0 if code == 0 else 1)


if __name__ == "__main__":
    main()
