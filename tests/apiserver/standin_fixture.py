"""Test fixture: runs the stand-in as a subprocess on a free port and drives
it with real kubectl (env KUBECTL) and plain HTTP."""
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "fixtures")


def find_kubectl():
    for cand in (os.environ.get("KUBECTL"),
                 os.path.join(HERE, "..", "..", ".tools", "bin", "kubectl"),
                 "/usr/bin/kubectl", shutil.which("kubectl")):
        if cand and os.access(cand, os.X_OK):
            return cand
    raise unittest.SkipTest("no kubectl found (set KUBECTL)")


class StandIn:
    def __init__(self, *extra, state=None, tmp=None):
        self.tmp = tmp or tempfile.mkdtemp(prefix="standin-test-")
        self.extra, self.state = list(extra), state
        self.kubectl_bin = find_kubectl()
        self.proc = None
        self.start()

    def start(self):
        ready = os.path.join(self.tmp, "ready")
        if os.path.exists(ready):
            os.unlink(ready)
        self.kubeconfig = os.path.join(self.tmp, "kubeconfig")
        cmd = [sys.executable, os.path.join(HERE, "standin.py"), "--listen", "127.0.0.1:0",
               "--ready-file", ready, "--kubeconfig-out", self.kubeconfig] + self.extra
        if self.state:
            cmd += ["--state", self.state]
        self.log = open(os.path.join(self.tmp, "standin.log"), "ab")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while not os.path.exists(ready):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("stand-in did not start:\n" + self.logs())
            time.sleep(0.05)
        with open(ready) as f:
            self.url = f.read().strip()
        u = urllib.parse.urlsplit(self.url)
        self.host, self.port = u.hostname, u.port

    def logs(self):
        with open(os.path.join(self.tmp, "standin.log"), errors="replace") as f:
            return f.read()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()

    def kubectl(self, *args, input=None, check=True, timeout=60):
        cmd = [self.kubectl_bin, "--kubeconfig", self.kubeconfig,
               "--cache-dir", os.path.join(self.tmp, "kcache")] + list(args)
        res = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout)
        if check and res.returncode != 0:
            raise AssertionError("kubectl %s failed (%d):\n%s%s" % (
                " ".join(args), res.returncode, res.stdout, res.stderr))
        return res

    def api(self, method, path, body=None, ctype="application/json", headers=None):
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        data = json.dumps(body).encode() if body is not None else None
        hdrs = {"Content-Type": ctype, **(headers or {})}
        conn.request(method, path, body=data, headers=hdrs)
        resp = conn.getresponse()
        raw = resp.read()
        conn.close()
        try:
            return resp.status, json.loads(raw)
        except ValueError:
            return resp.status, raw.decode(errors="replace")

    def wait_for(self, fn, timeout=15, interval=0.1, what="condition"):
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            last = fn()
            if last:
                return last
            time.sleep(interval)
        raise AssertionError("timed out waiting for %s (last: %r)" % (what, last))


class StandInCase(unittest.TestCase):
    """One stand-in per test class."""
    extra_args = ()

    @classmethod
    def setUpClass(cls):
        cls.s = StandIn(*cls.extra_args)

    @classmethod
    def tearDownClass(cls):
        cls.s.stop()
        shutil.rmtree(cls.s.tmp, ignore_errors=True)

    def kubectl(self, *args, **kw):
        return self.s.kubectl(*args, **kw)
