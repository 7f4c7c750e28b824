"""A network partition between replicas (not a crash): each replica's worker runs in its
own network namespace, joined to the other through veth pairs and a bridge (like the
limited-link benchmarks, bench/netns.py), and the test takes replica 1's link down for a
while. Root only; skipped where namespaces cannot be made.

- Cut for less than runtime.collectiveTimeoutSeconds: the sync round waits (TCP
  retransmits once the link is back) and training goes on: 0 recoveries, no restart.
- Cut for longer: the collective times out on both sides, every rank recovers in place
  once the link is back (nobody died, so nobody is replaced): exactly one recovery per
  rank, no replacement, and edit-run exits 0.

edit-run starts its workers as `edit-train` next to itself, so the test runs a copy of
edit-run beside a wrapper of that name which enters the replica's namespace and gives the
worker the replica's address (MASTER_ADDR: replica 0's).
"""
import os
import re
import shutil
import stat
import subprocess
import threading
import time
import unittest

import test_edit_run as base  # the mode tests' temp dir, corpus and tiny schedule
from edit_testing import edit_run
from edit_testing.logs import summaries
from edit_testing.paths import EDIT_RUN, EDIT_TRAIN

SUBNET = "10.78.0"


def sh(*cmd, check=True):
    r = subprocess.run(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {r.stdout.strip()}")
    return r


class Namespaces:
    """Replica namespaces, 10.78.0.1, .2, ..., veth pairs into one bridge; names carry the
    test's pid and a count so that concurrent runs, and the next test, do not meet."""

    made = 0

    def __init__(self, replicas):
        Namespaces.made += 1
        tag = f"{os.getpid() % 10000}{Namespaces.made % 10}"
        self.bridge = "edpb" + tag
        self.ns = [f"edpart{tag}-{m}" for m in range(replicas)]
        self.host_if = [f"edph{tag}{m}" for m in range(replicas)]

    @staticmethod
    def available():
        if os.geteuid() != 0:
            return "not root: the partition test needs network namespaces"
        if not shutil.which("ip"):
            return "ip (iproute2) not found"
        probe = f"edpprobe{os.getpid() % 100000}"
        r = sh("ip", "netns", "add", probe, check=False)
        if r.returncode != 0:
            return f"`ip netns add` is not permitted here: {r.stdout.strip()}"
        sh("ip", "netns", "del", probe, check=False)
        return None

    def setup(self):
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        sh("ip", "link", "set", self.bridge, "up")
        for m, ns in enumerate(self.ns):
            inner = f"edpn{m}"
            sh("ip", "netns", "add", ns)
            sh("ip", "link", "add", self.host_if[m], "type", "veth", "peer", "name", inner, "netns", ns)
            sh("ip", "link", "set", self.host_if[m], "master", self.bridge)
            sh("ip", "link", "set", self.host_if[m], "up")
            ex = ["ip", "netns", "exec", ns]
            sh(*ex, "ip", "link", "set", "lo", "up")
            sh(*ex, "ip", "addr", "add", f"{self.addr(m)}/24", "dev", inner)
            sh(*ex, "ip", "link", "set", inner, "up")

    def teardown(self):
        for host_if in self.host_if:
            sh("ip", "link", "del", host_if, check=False)  # its peer in the namespace goes with it
        for ns in self.ns:
            sh("ip", "netns", "del", ns, check=False)
        sh("ip", "link", "del", self.bridge, check=False)

    @staticmethod
    def addr(m):
        return f"{SUBNET}.{m + 1}"

    def cut(self, m, down):
        sh("ip", "link", "set", self.host_if[m], "down" if down else "up")


class Partition(unittest.TestCase):
    setUp = base.EditRun.setUp
    tearDown = base.EditRun.tearDown
    base_sets = base.EditRun.base_sets

    def start_namespaces(self):
        why = Namespaces.available()
        if why:
            self.skipTest(why)
        self.net = Namespaces(2)
        self.addCleanup(self.net.teardown)
        self.net.setup()
        # edit-run runs the edit-train beside itself: a copy of it beside the wrapper.
        bin_dir = os.path.join(self.d, "bin")
        os.makedirs(bin_dir)
        shutil.copy2(EDIT_RUN, os.path.join(bin_dir, "edit-run"))
        wrapper = os.path.join(bin_dir, "edit-train")
        cases = "\n".join(f"  {m}) ns={ns}; addr={self.net.addr(m)} ;;" for m, ns in enumerate(self.net.ns))
        with open(wrapper, "w") as f:
            f.write("#!/bin/sh\n"
                    "# Replica m's worker in namespace m, on its address; rank 0's store on replica 0's.\n"
                    'case $((RANK / EDIT_SHARDS)) in\n' + cases + "\nesac\n"
                    f'exec ip netns exec "$ns" env MASTER_ADDR={self.net.addr(0)} EDIT_BIND_ADDR="$addr" '
                    f'{EDIT_TRAIN} "$@"\n')
        os.chmod(wrapper, os.stat(wrapper).st_mode | stat.S_IXUSR)
        return os.path.join(bin_dir, "edit-run")

    def run_with_cut(self, timeout_s, cut_s, at_step=20):
        """edit-run, M=2 N=1, with replica 1's link down for cut_s seconds from the first
        progress line at or past at_step; returns (process, log dir, longest gap between
        progress lines in seconds)."""
        edit_run_copy = self.start_namespaces()
        logs = os.path.join(self.d, "logs")
        sets = self.base_sets() + ["algorithm.mode=edit", "training.steps=120", "training.logEvery=1",
                                   f"runtime.collectiveTimeoutSeconds={timeout_s}",
                                   "runtime.rendezvousTimeoutSeconds=120"]
        p = subprocess.Popen(edit_run.command(2, sets, log_dir=logs, binary=edit_run_copy),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.addCleanup(lambda: p.poll() is None and p.kill())
        times, err = [], []
        reached = threading.Event()

        def read_out():
            for line in p.stdout:
                m = re.match(r"step\s+(\d+)/", line)
                if m:
                    times.append(time.monotonic())
                    if int(m.group(1)) >= at_step:
                        reached.set()

        readers = [threading.Thread(target=read_out, daemon=True),
                   threading.Thread(target=lambda: err.extend(p.stderr), daemon=True)]
        for t in readers:
            t.start()
        self.assertTrue(reached.wait(300), "training did not reach step %d: %s" % (at_step, "".join(err)[-3000:]))
        self.net.cut(1, True)
        time.sleep(cut_s)
        self.net.cut(1, False)
        p.wait(timeout=400)
        for t in readers:
            t.join(timeout=10)
        p.stdout.close()
        p.stderr.close()
        p.stderr_text = "".join(err)
        gap = max((b - a for a, b in zip(times, times[1:])), default=0.0)
        return p, logs, gap

    def test_cut_shorter_than_the_collective_timeout_costs_nothing(self):
        p, logs, gap = self.run_with_cut(timeout_s=30, cut_s=5)
        self.assertEqual(p.returncode, 0, p.stderr_text[-3000:])
        # The cut held a sync round up (so the test saw the partition), and no one recovered.
        self.assertGreater(gap, 4.0, "no progress gap: the cut did not reach a sync round")
        self.assertNotIn("starting a replacement", p.stderr_text)
        s = summaries(logs)
        self.assertEqual(sorted(s), [0, 1])
        for r in s:
            self.assertEqual(s[r]["recoveries"], 0, s[r])
            self.assertEqual(s[r]["steps"], 120, s[r])
        print(f"\nshort cut: 5 s, training paused {gap:.1f} s, 0 recoveries")

    def test_cut_longer_than_the_collective_timeout_recovers_once_in_place(self):
        p, logs, gap = self.run_with_cut(timeout_s=10, cut_s=20)
        self.assertEqual(p.returncode, 0, p.stderr_text[-3000:])
        self.assertNotIn("starting a replacement", p.stderr_text)  # nobody died: nobody replaced
        s = summaries(logs)
        self.assertEqual(sorted(s), [0, 1])
        for r in s:
            self.assertEqual(s[r]["recoveries"], 1, s[r])
            self.assertEqual(s[r]["resumed_from"], -1, s[r])  # in place, not from a checkpoint
            self.assertEqual(s[r]["steps"], 120, s[r])
        lost = max(s[r]["steps_rolled_back"] for r in s)
        print(f"\nlong cut: 20 s, training paused {gap:.1f} s, 1 recovery, {lost} steps redone")


if __name__ == "__main__":
    from edit_testing.unittest_main import main  # exits 77 (ctest: skipped) when every test skipped
    main()
