"""The stand-in cluster of the end-to-end tests, the fault suite and the Kubernetes-path
benchmarks: the API stand-in (tests/apiserver/standin.py) with its local kubelet, the
edit-operator, real kubectl, and trackers of a job's pods.

Everything a Cluster starts lives in one temporary directory and is stopped in close(),
also when the test fails (tests call it from addCleanup). Ports are picked at run time.
"""
import glob
import http.client
import importlib.util
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

from . import logs
from .net import free_port
from .paths import OPERATOR, RUNTIME_DIR, STANDIN, find_kubectl

GROUP = "/apis/edit.io/v1alpha1"


def stop_process(p, sig=signal.SIGTERM, grace=20):
    """Signals a child and reaps it; SIGKILL after `grace` seconds."""
    if p and p.poll() is None:
        p.send_signal(sig)
        try:
            p.wait(grace)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def unique(prefix):
    """Job and namespace names are global on this machine (/etc/hosts is shared)."""
    return "%s-%x%04x" % (prefix, os.getpid() & 0xffff, random.randrange(1 << 16))


def job_manifest(name, ns, data_dir, ckpt_dir, master_port, steps=60, every=10, replicas=2,
                 shards=2, backoff=3, hang=0, extra_algorithm=None, debug=None, env=None):
    """The tiny fast job used by every test (dim 64, 2 layers, seqLen 32, batch 4)."""
    spec = {
        "replicas": replicas, "shardsPerReplica": shards, "image": "unused.local/edit-runtime:test",
        "command": ["edit-train"], "masterPort": master_port,
        "env": list(env or []),
        "model": {"preset": "tiny", "dim": 64, "heads": 4, "ffnDim": 176, "layers": 2},
        "data": {"train": os.path.join(data_dir, "train.bin"), "val": os.path.join(data_dir, "val.bin"),
                 "seqLen": 32, "batchSize": 4, "valBatches": 4},
        "training": {"steps": steps, "lr": 3e-3, "lrWarmupSteps": 5, "logEvery": 1},
        "algorithm": dict({"mode": "edit", "warmupSteps": 8, "syncInterval": 4,
                           "penalty": {"anomalyWarmup": 3}}, **(extra_algorithm or {})),
        "checkpoint": {"dir": ckpt_dir, "everySteps": every, "keep": 100},
        # One intra-op thread per worker: 4 workers share 2 cores.
        "runtime": {"threads": 1},
        "runPolicy": {"backoffLimit": backoff},
    }
    if hang:
        spec["hangTimeoutSeconds"] = hang
    if debug:
        spec["debug"] = debug
    return {"apiVersion": "edit.io/v1alpha1", "kind": "EDiTJob",
            "metadata": {"name": name, "namespace": ns}, "spec": spec}


class Failure(AssertionError):
    pass


class TelemetryProxy:
    """A TCP relay between the workers and the operator's telemetry port, which a test can
    cut (block: open connections dropped, new ones closed at once) and mend (unblock), as a
    network between the workers and the operator fails and heals."""

    def __init__(self, target_port):
        self.target = ("127.0.0.1", target_port)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(256)
        self.port = self.sock.getsockname()[1]
        self.blocked = threading.Event()
        self.closed = threading.Event()
        self.lock = threading.Lock()
        self.conns = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.closed.is_set():
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            if self.blocked.is_set():
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self.lock:
                self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src, dst):
        try:
            while True:
                data = src.recv(65536)
                if not data or self.blocked.is_set():
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.close()
            except OSError:
                pass

    def block(self):
        self.blocked.set()
        with self.lock:
            conns, self.conns = self.conns, []
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
                c.close()
            except OSError:
                pass

    def unblock(self):
        self.blocked.clear()

    def close(self):
        self.closed.set()
        self.block()
        self.sock.close()


class Cluster:
    """A stand-in (+kubelet), optionally an operator, in one temp dir."""

    def __init__(self, nodes=1, state=True, prefix="edit-e2e-", tmp_dir=None, path_prepend=(), images=False,
                 standin_args=(), telemetry_proxy=False):
        self.tmp = tempfile.mkdtemp(prefix=prefix, dir=tmp_dir)
        self.images = images                 # the kubelet runs containers in their images
        self.path_prepend = [RUNTIME_DIR] + list(path_prepend)
        self.kubectl_bin = find_kubectl()
        self.state = os.path.join(self.tmp, "state.json") if state else None
        self.nodes = nodes
        self.standin = None
        self.standin_logs = []
        self.op = None
        self.op_logs = []
        self.op_grpc_port = None
        self.metrics_addr = None
        self.port = 0
        self.trackers = []
        self.data_dir = None
        self.standin_args = list(standin_args)  # e.g. ["--gc-delay", "4"]
        # Workers reach the operator through a TelemetryProxy the test can cut.
        self.telemetry_proxy = telemetry_proxy
        self.proxy = None

    # ---- the stand-in -----------------------------------------------------------------
    def start_standin(self):
        ready = os.path.join(self.tmp, "ready")
        if os.path.exists(ready):
            os.unlink(ready)
        self.kubeconfig = os.path.join(self.tmp, "kubeconfig")
        log = os.path.join(self.tmp, "standin-%d.log" % len(self.standin_logs))
        self.standin_logs.append(log)
        cmd = [sys.executable, STANDIN, "--listen", "127.0.0.1:%d" % self.port, "--ready-file", ready,
               "--kubeconfig-out", self.kubeconfig, "--kubelet",
               "--kubelet-workdir", os.path.join(self.tmp, "kubelet"),
               "--nodes", str(self.nodes), "--bookmark-interval", "2"]
        for d in self.path_prepend:
            cmd += ["--path-prepend", d]
        if self.images:
            cmd.append("--kubelet-images")
        if self.state:
            cmd += ["--state", self.state]
        cmd += self.standin_args
        with open(log, "ab") as f:
            self.standin = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT,
                                            env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))
        deadline = time.monotonic() + 30
        while not os.path.exists(ready):
            if self.standin.poll() is not None or time.monotonic() > deadline:
                raise Failure("stand-in did not start:\n" + self.tail(log))
            time.sleep(0.05)
        with open(ready) as f:
            self.url = f.read().strip()
        u = urllib.parse.urlsplit(self.url)
        self.host, self.port = u.hostname, u.port

    def stop_standin(self, sig=signal.SIGTERM):
        p, self.standin = self.standin, None
        stop_process(p, sig)

    # ---- the operator -----------------------------------------------------------------
    def start_operator(self, namespaces, extra=()):
        if self.op_grpc_port is None:
            # The same telemetry address across operator restarts, as a Service would be.
            self.op_grpc_port = free_port()
        grpc = "127.0.0.1:%d" % self.op_grpc_port
        advertise = grpc
        if self.telemetry_proxy:
            if self.proxy is None:
                self.proxy = TelemetryProxy(self.op_grpc_port)
            advertise = "127.0.0.1:%d" % self.proxy.port
        log = os.path.join(self.tmp, "operator-%d.log" % len(self.op_logs))
        self.op_logs.append(log)
        cmd = [OPERATOR, "--kubeconfig", self.kubeconfig, "--namespaces", ",".join(namespaces),
               "--metrics-addr", "127.0.0.1:0", "--health-addr", "127.0.0.1:0",
               "--grpc-addr", grpc, "--telemetry-advertise-addr", advertise, "--resync-seconds", "5"] + list(extra)
        deadline = time.monotonic() + 30
        while True:
            with open(log, "ab") as f:
                self.op = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
            line = None
            while time.monotonic() < deadline and self.op.poll() is None:
                line = self.first_operator_line(log)
                if line:
                    break
                time.sleep(0.05)
            if line:
                break
            # The gRPC port of a previous operator may still be in TIME_WAIT: retry.
            if self.op.poll() is None:
                self.op.kill()
            self.op.wait()
            if time.monotonic() > deadline:
                raise Failure("operator did not start:\n" + self.tail(log))
            time.sleep(0.5)
        self.metrics_addr = line["metricsAddr"]
        self.health_addr = line.get("healthAddr")
        return line

    @staticmethod
    def first_operator_line(log):
        try:
            with open(log) as f:
                for raw in f:
                    try:
                        j = json.loads(raw)
                    except ValueError:
                        continue
                    if j.get("msg") == "edit-operator listening":
                        return j
        except OSError:
            pass
        return None

    def stop_operator(self, sig=signal.SIGTERM):
        p, self.op = self.op, None
        stop_process(p, sig)

    def operator_metrics(self):
        host, port = self.metrics_addr.rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        conn.request("GET", "/metrics")
        body = conn.getresponse().read().decode()
        conn.close()
        return body

    def metric_value(self, name, **labels):
        """Sum of the samples of `name` whose labels include `labels`."""
        total, found = 0.0, False
        for line in self.operator_metrics().splitlines():
            if not line.startswith(name):
                continue
            rest = line[len(name):]
            if rest and rest[0] not in "{ ":
                continue
            lbl = ""
            if rest.startswith("{"):
                lbl, rest = rest[1:].split("}", 1)
            if all('%s="%s"' % (k, v) in lbl for k, v in labels.items()):
                total += float(rest.split()[0])
                found = True
        return total if found else None

    # ---- clients ----------------------------------------------------------------------
    def kubectl(self, *args, input=None, check=True, timeout=60):
        cmd = [self.kubectl_bin, "--kubeconfig", self.kubeconfig,
               "--cache-dir", os.path.join(self.tmp, "kcache")] + list(args)
        res = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout)
        if check and res.returncode != 0:
            raise Failure("kubectl %s failed (%d):\n%s%s" % (" ".join(args), res.returncode,
                                                             res.stdout, res.stderr))
        return res

    def api(self, method, path, body=None, ctype="application/json", timeout=15):
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            conn.request(method, path, body=json.dumps(body).encode() if body is not None else None,
                         headers={"Content-Type": ctype})
            resp = conn.getresponse()
            raw = resp.read()
        finally:
            conn.close()
        try:
            return resp.status, json.loads(raw)
        except ValueError:
            return resp.status, raw.decode(errors="replace")

    def get(self, path):
        code, body = self.api("GET", path)
        if code != 200:
            raise Failure("GET %s: %d %s" % (path, code, body))
        return body

    def job(self, ns, name):
        return self.get("%s/namespaces/%s/editjobs/%s" % (GROUP, ns, name))

    def pods(self, ns, job):
        sel = urllib.parse.quote("edit.io/job-name=%s" % job)
        return self.get("/api/v1/namespaces/%s/pods?labelSelector=%s" % (ns, sel))["items"]

    def kill(self, ns, pod, sig="KILL"):
        code, body = self.api("POST", "/standin/kill?namespace=%s&pod=%s&signal=%s" % (ns, pod, sig))
        if code != 200 or not body.get("signalled"):
            raise Failure("kill %s/%s %s: %d %s" % (ns, pod, sig, code, body))
        return body

    def create_namespace(self, ns):
        self.kubectl("create", "namespace", ns)

    def apply(self, obj):
        return self.kubectl("apply", "-f", "-", input=json.dumps(obj))

    def wait_for(self, fn, timeout, what, interval=0.2):
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            try:
                last = fn()
            except (Failure, OSError, http.client.HTTPException) as e:
                last = "error: %s" % e
            else:
                if last:
                    return last
            time.sleep(interval)
        raise Failure("timed out after %ss waiting for %s (last: %r)\n%s" % (timeout, what, last,
                                                                          self.diagnostics()))

    def wait_phase(self, ns, name, phases, timeout):
        phases = (phases,) if isinstance(phases, str) else tuple(phases)

        def fn():
            j = self.job(ns, name)
            return j if j.get("status", {}).get("phase") in phases else None
        return self.wait_for(fn, timeout, "job %s/%s phase in %s" % (ns, name, phases))

    def live_step(self, ns, name):
        """The job's step as a user watches it live: the operator's edit_job_step (the
        slowest worker's last report). Status shows progress at most every 15 s, so a test
        that acts at a step must not wait for it there. None without a running operator."""
        if self.op is None or self.op.poll() is not None or not getattr(self, "metrics_addr", None):
            return None
        try:
            v = self.metric_value("edit_job_step", namespace=ns, job=name)
        except (OSError, http.client.HTTPException):
            return None
        return None if v is None else int(v)

    def wait_step(self, ns, name, step, timeout):
        """Waits until the job reached `step` (live, else in its status); returns its status
        with progress.step the step reached."""
        def fn():
            st = self.job(ns, name).get("status", {})
            reached = max((st.get("progress") or {}).get("step", 0), self.live_step(ns, name) or 0)
            if reached < step:
                return None
            return dict(st, progress=dict(st.get("progress") or {}, step=reached))
        return self.wait_for(fn, timeout, "job %s/%s step >= %d" % (ns, name, step), interval=0.1)

    def running_pods(self, ns, job, n, gen=None):
        """Wait until n pods of the job (of generation gen) run; returns them by rank."""
        def fn():
            ps = [p for p in self.pods(ns, job) if p.get("status", {}).get("phase") == "Running"
                  and not p["metadata"].get("deletionTimestamp")
                  and (gen is None or p["metadata"]["labels"].get("edit.io/restart-generation") == str(gen))]
            return sorted(ps, key=lambda p: int(p["metadata"]["labels"]["edit.io/rank"])) if len(ps) == n else None
        return self.wait_for(fn, 120, "%d running pods of %s (generation %s)" % (n, job, gen))

    # ---- pod logs -------------------------------------------------------------------
    def pod_logs(self, ns, pod, uid=None):
        """Every worker log of this pod name (uid: one incarnation)."""
        pat = os.path.join(self.tmp, "kubelet", "pods", "%s_%s_%s" % (ns, pod, uid or "*"), "worker.log")
        return sorted(glob.glob(pat))

    def summaries(self, ns, job):
        """{rank: [its summaries, one per incarnation that finished]} of a job's pods."""
        out = {}
        for f in glob.glob(os.path.join(self.tmp, "kubelet", "pods", "%s_%s-worker-*" % (ns, job), "worker.log")):
            for s in logs.read(f)[1]:
                out.setdefault(s["rank"], []).append(s)
        return out

    def progress(self, ns, job, rank):
        """(uid, [@edit rows]) for each incarnation of a rank's pod, oldest first."""
        rows = []
        for f in glob.glob(os.path.join(self.tmp, "kubelet", "pods", "%s_%s-worker-%d_*" % (ns, job, rank), "worker.log")):
            rows.append((os.path.getmtime(f), os.path.basename(os.path.dirname(f)), logs.read(f)[0]))
        return [x[1:] for x in sorted(rows)]

    # ---- diagnostics / teardown -----------------------------------------------------
    @staticmethod
    def tail(path, n=4000):
        try:
            with open(path, errors="replace") as f:
                return f.read()[-n:]
        except OSError:
            return "(no %s)" % path

    # A worker's lines that explain a failure: not its per-step @edit rows, nor the lines
    # every healthy worker prints.
    ROUTINE = ("@edit", "OpenBLAS kernels:", "OpenMP wait policy:", "metrics on ", "memory per rank",
               "checkpoint ")

    @classmethod
    def worker_messages(cls, path, n=700):
        try:
            with open(path, errors="replace") as f:
                lines = [l for l in f if not any(l.split("] ", 1)[-1].startswith(r) for r in cls.ROUTINE)]
        except OSError:
            return "(no %s)" % path
        return "".join(lines)[-n:] or "(no messages)\n"

    def diagnostics(self):
        # Worker messages first: CI keeps the head of a long failure output.
        out = ["---- worker messages, by when each pod last wrote ----"]
        for f in sorted(glob.glob(os.path.join(self.tmp, "kubelet", "pods", "*", "worker.log")),
                        key=os.path.getmtime):
            out.append("%s:\n%s" % (os.path.basename(os.path.dirname(f)), self.worker_messages(f)))
        for log in self.op_logs[-2:]:
            out.append("---- %s ----\n%s" % (os.path.basename(log), self.tail(log, 3000)))
        for log in self.standin_logs[-1:]:
            out.append("---- %s ----\n%s" % (os.path.basename(log), self.tail(log, 1500)))
        # Every incarnation (a replaced pod's log is the one that explains a failure).
        for f in sorted(glob.glob(os.path.join(self.tmp, "kubelet", "pods", "*", "worker.log")),
                        key=os.path.getmtime)[-10:]:
            out.append("---- %s ----\n%s" % (f[len(self.tmp):], self.tail(f, 1500)))
        return "\n".join(out)

    def close(self):
        for t in self.trackers:
            t.stop()
        if self.proxy is not None:
            self.proxy.close()
        self.stop_operator()
        self.stop_standin()
        if os.environ.get("EDIT_KEEP_TMP"):
            print("kept", self.tmp, file=sys.stderr)
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)


class PodTracker:
    """Polls a job's pods and checks the gang invariants over time."""

    def __init__(self, cluster, ns, job, interval=0.2):
        self.c, self.ns, self.job = cluster, ns, job
        self.snapshots = []
        self.uids = {}           # uid -> (name, rank, generation)
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()
        cluster.trackers.append(self)

    def _loop(self):
        while not self.stopped.is_set():
            try:
                pods = self.c.pods(self.ns, self.job)
            except Exception:    # the stand-in may be restarting
                pods = None
            if pods is not None:
                snap = []
                for p in pods:
                    md = p["metadata"]
                    lb = md.get("labels", {})
                    item = (md["name"], md["uid"], int(lb.get("edit.io/rank", -1)),
                            int(lb.get("edit.io/restart-generation", -1)),
                            p.get("status", {}).get("phase"), bool(md.get("deletionTimestamp")))
                    snap.append(item)
                    self.uids.setdefault(md["uid"], (item[0], item[2], item[3]))
                self.snapshots.append((time.monotonic(), snap))
            self.stopped.wait(self.interval_s())

    def interval_s(self):
        return 0.2

    def stop(self):
        self.stopped.set()
        self.thread.join(5)

    def problems(self, world):
        """Duplicate pods: more than `world` pods, two live generations at once, or a rank
        of a generation created twice."""
        out = []
        for t, snap in self.snapshots:
            if len(snap) > world:
                out.append("%d pods at once: %s" % (len(snap), snap))
            live = {g for (_, _, _, g, phase, deleting) in snap
                    if not deleting and phase not in ("Succeeded", "Failed")}
            if len(live) > 1:
                out.append("live pods of generations %s at once: %s" % (sorted(live), snap))
        seen = {}
        for uid, (name, rank, gen) in self.uids.items():
            seen.setdefault((rank, gen), []).append(uid)
        for key, uids in seen.items():
            if len(uids) > 1:
                out.append("rank %d generation %d created %d times" % (key[0], key[1], len(uids)))
        return out

    def generations(self):
        gens = {}
        for uid, (name, rank, gen) in self.uids.items():
            gens.setdefault(gen, set()).add(rank)
        return gens


def has_join_env(pod):
    """True for a pod created to join a running job in place (EDIT_JOIN=1)."""
    for c in pod.get("spec", {}).get("containers", []):
        for e in c.get("env", []):
            if e.get("name") == "EDIT_JOIN" and e.get("value") == "1":
                return True
    return False


class RecoveryTracker(PodTracker):
    """A PodTracker that also notes which pods were created to join a running job
    (EDIT_JOIN=1): a recovered rank has two incarnations in one generation, and only a
    replacement may be the second."""

    def __init__(self, cluster, ns, job):
        self.joining = set()  # uids
        tracker = self

        class Spy:  # passes everything to the cluster; notes the joiners in each pod list
            def __getattr__(self, name):
                return getattr(cluster, name)

            def pods(self, ns_, job_):
                items = cluster.pods(ns_, job_)
                tracker.joining.update(p["metadata"]["uid"] for p in items if has_join_env(p))
                return items
        super().__init__(Spy(), ns, job)

    def incarnations(self, rank, gen):
        """uids of (rank, generation) in the order they were first seen."""
        return [uid for uid, (_, r, g) in self.uids.items() if r == rank and g == gen]

    def recovered_ranks(self):
        return sorted({r for uid, (_, r, _) in self.uids.items() if uid in self.joining})

    def problems(self, world):
        out = []
        for p in super().problems(world):
            m = re.match(r"rank (\d+) generation (\d+) created \d+ times", p)
            if m:
                uids = self.incarnations(int(m.group(1)), int(m.group(2)))
                if uids[0] not in self.joining and all(u in self.joining for u in uids[1:]):
                    continue  # the failed pod, then its replacement(s)
            out.append(p)
        for uid in self.joining:
            name, rank, gen = self.uids[uid]
            if self.incarnations(rank, gen)[0] == uid:
                out.append("%s (rank %d generation %d) joined without replacing a failed pod" % (name, rank, gen))
        return out


def local_image_id(ref):
    """The stand-in kubelet's own lookup of a locally built image (tests/apiserver/images.py),
    so that a test skips exactly when the kubelet could not run the image. Loaded from its
    file: the stand-in is a program with its own modules, not a package."""
    path = os.path.join(os.path.dirname(STANDIN), "images.py")
    spec = importlib.util.spec_from_file_location("standin_images", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.local_image_id(ref)
