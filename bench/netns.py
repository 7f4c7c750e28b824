"""Network namespaces for the limited-link scenarios of the benchmarks (run.py,
compression.py): one namespace per replica, joined through a bridge, with tbf shaping
each namespace's egress. Root only; NetNS.available() says why not otherwise."""

import os
import shutil
import subprocess
import sys

from common import BRIDGE, NS_PREFIX, SUBNET, run_cmd


class NetNS:
    """Replica namespaces joined by veth pairs through a bridge; tbf on each namespace's
    egress. Replica m's workers all live in namespace m (address 10.77.0.(m+1)), so the
    shard group's traffic stays inside the namespace (it is routed over its loopback) and
    only replica-to-replica traffic crosses the shaped veth."""

    def __init__(self):
        self.names = []
        self.active = False

    @staticmethod
    def available():
        if os.geteuid() != 0:
            return False, "not root: the limited-link scenarios need network namespaces (run as root)"
        if shutil.which("ip") is None or shutil.which("tc") is None:
            return False, "ip/tc (iproute2) not found"
        probe = NS_PREFIX + "probe"
        r = run_cmd(["ip", "netns", "add", probe], check=False)
        if r.returncode != 0:
            return False, f"`ip netns add` failed: {r.stderr.strip()}"
        run_cmd(["ip", "netns", "del", probe], check=False)
        return True, ""

    @staticmethod
    def cleanup_all():
        """Removes every namespace and the bridge this script may have left behind."""
        r = run_cmd(["ip", "netns", "list"], check=False)
        for line in r.stdout.splitlines():
            name = line.split()[0] if line.split() else ""
            if name.startswith(NS_PREFIX):
                run_cmd(["ip", "netns", "del", name], check=False)
        if run_cmd(["ip", "link", "show", BRIDGE], check=False).returncode == 0:
            run_cmd(["ip", "link", "del", BRIDGE], check=False)

    def setup(self, replicas, rate):
        self.cleanup_all()
        self.active = True
        burst = "256kb" if rate.startswith("100") else "64kb"
        run_cmd(["ip", "link", "add", BRIDGE, "type", "bridge"])
        run_cmd(["ip", "link", "set", BRIDGE, "up"])
        self.names = []
        for m in range(replicas):
            ns, host, inner = f"{NS_PREFIX}{m}", f"edbh{m}", f"edbn{m}"
            run_cmd(["ip", "netns", "add", ns])
            run_cmd(["ip", "link", "add", host, "type", "veth", "peer", "name", inner])
            run_cmd(["ip", "link", "set", inner, "netns", ns])
            run_cmd(["ip", "link", "set", host, "master", BRIDGE])
            run_cmd(["ip", "link", "set", host, "up"])
            ex = ["ip", "netns", "exec", ns]
            run_cmd(ex + ["ip", "link", "set", "lo", "up"])
            run_cmd(ex + ["ip", "addr", "add", f"{self.addr(m)}/24", "dev", inner])
            run_cmd(ex + ["ip", "link", "set", inner, "up"])
            run_cmd(ex + ["tc", "qdisc", "add", "dev", inner, "root", "tbf", "rate", rate,
                          "burst", burst, "latency", "100ms"])
            self.names.append(ns)

    @staticmethod
    def addr(m):
        return f"{SUBNET}.{m + 1}"

    def measure(self, seconds=2.0):
        """Measured TCP throughput namespace 1 -> namespace 0 (Mbit/s), to show the shaping."""
        server = ("import socket,time,sys\n"
                  "s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
                  f"s.bind(('{self.addr(0)}',29999));s.listen(1);c,_=s.accept();n=0;t0=None\n"
                  "while True:\n"
                  " b=c.recv(1<<20)\n"
                  " if not b: break\n"
                  " t0=t0 or time.monotonic();n+=len(b)\n"
                  "print(n*8/(time.monotonic()-t0)/1e6)\n")
        client = ("import socket,time\n"
                  "s=socket.socket()\n"
                  "for i in range(50):\n"
                  "  try:\n"
                  f"    s.connect(('{self.addr(0)}',29999));break\n"
                  "  except OSError: time.sleep(0.1)\n"
                  f"b=b'x'*(1<<16);t=time.monotonic()\n"
                  f"while time.monotonic()-t<{seconds}: s.sendall(b)\n"
                  "s.close()\n")
        srv = subprocess.Popen(["ip", "netns", "exec", self.names[0], sys.executable, "-c", server],
                               stdout=subprocess.PIPE, text=True)
        cli = subprocess.run(["ip", "netns", "exec", self.names[1], sys.executable, "-c", client],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=30)
        try:
            out, _ = srv.communicate(timeout=30)
            return float(out.strip()) if cli.returncode == 0 else None
        except (subprocess.TimeoutExpired, ValueError):
            srv.kill()
            srv.wait()
            return None

    def teardown(self):
        if self.active:
            self.cleanup_all()
            self.active = False
            self.names = []
