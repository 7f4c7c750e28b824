#!/usr/bin/env python3
"""Runs the fault suite (ctest -L faults) N times in a row and reports pass counts: how
many whole-suite runs passed, and how often each case passed. A flaky case shows here
where one run of the suite would let it through.

    python3 tests/faults/loop.py 5 [--build-dir build] [-R kill_worker] [--out DIR]

Each run's ctest output is kept in --out (default build/tests/faults/loop-<time>/run-K.log)
together with a summary.json; the exit code is 0 only when every run passed.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULT = re.compile(r"^\s*\d+/\d+ Test\s+#\d+: (\S+) \.+\s*(\*{0,3}[A-Za-z ]+?)\s+[\d.]+ sec", re.M)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", type=int, help="how many times to run the suite")
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build"))
    ap.add_argument("-R", "--regex", default=None, help="only the cases matching (ctest -R)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    out = a.out or os.path.join(a.build_dir, "tests", "faults", "loop-" + time.strftime("%Y%m%d-%H%M%S"))
    os.makedirs(out, exist_ok=True)
    per_case, runs = {}, []
    for k in range(1, a.runs + 1):
        cmd = ["ctest", "--test-dir", a.build_dir, "-L", "faults", "--output-on-failure"]
        if a.regex:
            cmd += ["-R", a.regex]
        t0 = time.monotonic()
        p = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.monotonic() - t0
        with open(os.path.join(out, "run-%d.log" % k), "w") as f:
            f.write(p.stdout + p.stderr)
        results = {name: status.strip().lstrip("*") for name, status in RESULT.findall(p.stdout)}
        for name, status in results.items():
            c = per_case.setdefault(name, {"passed": 0, "failed": 0, "skipped": 0})
            c["passed" if status == "Passed" else "skipped" if "Skipped" in status or "Not Run" in status
              else "failed"] += 1
        failed = sorted(n for n, s in results.items() if s != "Passed")
        ok = p.returncode == 0 and bool(results)
        runs.append({"run": k, "passed": ok, "cases": len(results), "failed": failed, "seconds": round(wall)})
        print("run %d/%d: %s (%d cases, %d s)%s" % (k, a.runs, "passed" if ok else "FAILED", len(results), wall,
                                                   "" if ok else ": " + ", ".join(failed)), flush=True)
    passed = sum(1 for r in runs if r["passed"])
    streak = best = 0
    for r in runs:
        streak = streak + 1 if r["passed"] else 0
        best = max(best, streak)
    print("\nfault suite: %d of %d runs passed (longest streak %d)" % (passed, a.runs, best))
    for name in sorted(per_case):
        c = per_case[name]
        print("  %-45s passed %d of %d%s" % (name, c["passed"], a.runs,
                                             " (skipped %d)" % c["skipped"] if c["skipped"] else ""))
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump({"runs": runs, "cases": per_case, "passed_runs": passed, "longest_streak": best}, f, indent=1)
    print("logs: %s" % out)
    sys.exit(0 if passed == a.runs else 1)


if __name__ == "__main__":
    main()
