"""Local kubelet: registers fake nodes, binds pending pods, runs each
container's command as a local process group with its own 127.x pod IP (on the host,
or with images=True inside its image's root filesystem), reports status, and stops
pods gracefully on deletion.

On the host each container runs under a shim (shim.py) that records how it ended, so
a kubelet started after a crash of the stand-in (SIGKILL) adopts the pods' processes
that are still running instead of starting them again: containers outlive a restart of
a real API server or kubelet too. A stand-in stopped with SIGTERM stops its pods.

How one container starts, is probed and ends lives in containers.py; this file runs the
pods: nodes, binding, the pod worker, pod status, DNS entries and signals."""
import copy
import os
import queue
import signal
import subprocess
import tempfile
import threading
import time

import errors
import images as imagesmod
import podenv
import scheduler
from containers import Container
from shim import AdoptedProcess
from proxy import ServiceProxy
from hostsfile import HostsFile
from selection import match_labels
from store import now_iso

SIGNALS = {"KILL": signal.SIGKILL, "TERM": signal.SIGTERM, "STOP": signal.SIGSTOP,
           "CONT": signal.SIGCONT, "INT": signal.SIGINT, "HUP": signal.SIGHUP,
           "USR1": signal.SIGUSR1, "USR2": signal.SIGUSR2}


class PodRuntime:
    def __init__(self, pod, ip, pod_dir):
        md = pod["metadata"]
        self.uid, self.ns, self.name = md["uid"], md["namespace"], md["name"]
        self.ip, self.dir = ip, pod_dir
        self.phase = "Pending"
        self.started = now_iso()
        self.containers = []
        self.init = None                     # the init container running now
        self.stopping = False
        self.hostname = pod["spec"].get("hostname") or self.name
        self.subdomain = pod["spec"].get("subdomain")
        self.labels = dict(md.get("labels") or {})
        self.lock = threading.Lock()


class Kubelet:
    def __init__(self, store, registry, workdir=None, path_prepend=(), nodes=1, images=False, capacity=None):
        self.store, self.registry = store, registry
        # What each node offers the scheduler (--node-capacity over generous defaults).
        self.capacity = dict({"cpu": "64", "memory": "256Gi", "pods": "110"}, **(capacity or {}))
        self.pods_rt = registry.lookup("", "v1", "pods")
        self.workdir = workdir or tempfile.mkdtemp(prefix="standin-kubelet-")
        os.makedirs(self.workdir, exist_ok=True)
        self.path_prepend = [os.path.abspath(p) for p in path_prepend]
        self.node_names = ["local-node-%d" % i for i in range(max(1, nodes))]
        self.runtimes = {}                   # uid -> PodRuntime
        self.events = queue.Queue()
        self.stopped = threading.Event()
        self.lock = threading.RLock()
        self.hosts = HostsFile()
        self.hosts_dirty = threading.Event()
        self.rr = 0
        # A per-instance second octet keeps side-by-side stand-ins apart.
        self.ip_octet = 10 + os.getpid() % 200
        self.next_ip = 0
        self.api_url = ""
        self.proxy = ServiceProxy(store, registry)
        # Image mode: containers run inside their image's root filesystem (chroot_exec.py).
        self.images = imagesmod.Images() if images else None
        store.graceful = self._graceful
        store.allocate_cluster_ip = self.allocate_cluster_ip
        store.listeners.append(self._on_event)

    # ---- lifecycle ------------------------------------------------------------
    def start(self):
        self._register_nodes()
        self.proxy.sync()
        for pod in self.store.list(self.pods_rt)[0]:
            self._adopt(pod)
            self.events.put(("/pods", "ADDED", pod))
        threading.Thread(target=self._loop, name="kubelet", daemon=True).start()

    def stop(self):
        self.stopped.set()
        with self.lock:
            rts = list(self.runtimes.values())
        for rp in rts:
            rp.stopping = True
            self._signal_all(rp, signal.SIGTERM)
        deadline = time.monotonic() + 2
        for rp in rts:
            for c in rp.containers:
                while c.running() and time.monotonic() < deadline:
                    time.sleep(0.05)
            self._signal_all(rp, signal.SIGKILL)
        for rp in rts:
            for c in rp.containers:
                if c.proc is not None:
                    try:
                        c.proc.wait(5)           # before its image's rootfs goes away
                    except subprocess.TimeoutExpired:
                        pass
        if self.images is not None:
            self.images.close()
        self.proxy.stop()
        self.hosts.remove()

    def _register_nodes(self):
        rt = self.registry.lookup("", "v1", "nodes")
        for name in self.node_names:
            node = {"metadata": {"name": name, "labels": {
                "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64", "node.kubernetes.io/instance-type": "standin"}},
                "spec": {},
                "status": {"conditions": [{"type": "Ready", "status": "True",
                                           "reason": "KubeletReady",
                                           "message": "stand-in kubelet is ready",
                                           "lastHeartbeatTime": now_iso(),
                                           "lastTransitionTime": now_iso()}],
                           "addresses": [{"type": "InternalIP", "address": "127.0.0.1"},
                                         {"type": "Hostname", "address": name}],
                           "capacity": dict(self.capacity),
                           "allocatable": dict(self.capacity),
                           "nodeInfo": {"kubeletVersion": "v1.33.0-standin",
                                        "operatingSystem": "linux", "architecture": "amd64",
                                        "containerRuntimeVersion": "standin://1"}}}
            if self.store.find(rt, "", name) is None:
                self.store.create(rt, "", node)

    def _graceful(self, rt, obj):
        return rt.key == "/pods" and (obj.get("spec") or {}).get("nodeName") in self.node_names

    def _on_event(self, rt, etype, obj):
        # Called under the store lock: only queue the work.
        if rt is not None and rt.key in ("/pods", "/services"):
            self.events.put((rt.key, etype, obj))

    def _loop(self):
        last_retry = 0.0
        while not self.stopped.is_set():
            try:
                key, etype, obj = self.events.get(timeout=0.2)
                try:
                    if key == "/pods":
                        self._sync(etype, obj)
                    else:
                        self.proxy.sync()
                        self.hosts_dirty.set()
                except Exception as e:  # one bad pod must not stop the kubelet
                    import traceback
                    traceback.print_exc()
                    print("kubelet: %r" % (e,), flush=True)
            except queue.Empty:
                pass
            if time.monotonic() - last_retry > 1.0:
                last_retry = time.monotonic()
                self._schedule_pending()
            if self.hosts_dirty.is_set():
                self.hosts_dirty.clear()
                self._write_hosts()

    # ---- scheduling ------------------------------------------------------------
    def _schedule_pending(self):
        for pod in self.store.list(self.pods_rt)[0]:
            if not pod["spec"].get("nodeName") and not pod["metadata"].get("deletionTimestamp"):
                self._bind(pod)

    def _bind(self, pod):
        if pod["spec"].get("schedulerName", "default-scheduler") != "default-scheduler":
            return                             # another scheduler's pod (e.g. Volcano)
        md = pod["metadata"]
        if pod["spec"].get("schedulingGates"):
            # Not scheduled until every gate is removed (e.g. Kueue's admission gate).
            return self._set_scheduled_false(pod, "SchedulingGated", "Scheduling is blocked due to non-empty scheduling gates")
        nodes = [self.store.find(self.registry.lookup("", "v1", "nodes"), "", n)
                 for n in self.node_names]
        pods = [p for p in self.store.list(self.pods_rt)[0]
                if p.get("status", {}).get("phase") not in ("Succeeded", "Failed")]
        claims = self.registry.lookup("", "v1", "persistentvolumeclaims")
        node, reason = scheduler.choose_node(pod, [n for n in nodes if n], pods, self.rr,
                                             lambda name: self.store.find(claims, md["namespace"], name))

        def bind(o):
            if o["spec"].get("nodeName"):
                return o
            if node:
                o["spec"]["nodeName"] = node
            return o

        if not node:
            return self._set_scheduled_false(pod, "Unschedulable", reason)
        try:
            self.rr += 1
            self.store.mutate(self.pods_rt, md["namespace"], md["name"], bind)
        except errors.ApiError:
            pass

    def _set_scheduled_false(self, pod, reason, message):
        """PodScheduled False with the scheduler's reason, written when it changes."""
        md = pod["metadata"]
        if any(c.get("type") == "PodScheduled" and c.get("reason") == reason and c.get("message") == message
               for c in pod.get("status", {}).get("conditions") or []):
            return

        def fn(o):
            conds = [c for c in o.get("status", {}).get("conditions") or []
                     if c.get("type") != "PodScheduled"]
            conds.append({"type": "PodScheduled", "status": "False", "reason": reason,
                          "message": message, "lastTransitionTime": now_iso()})
            o.setdefault("status", {})["conditions"] = conds
            return o
        try:
            self.store.mutate(self.pods_rt, md["namespace"], md["name"], fn, "status")
        except errors.ApiError:
            pass

    # ---- pod sync ----------------------------------------------------------------
    def _sync(self, etype, pod):
        md, spec = pod["metadata"], pod.get("spec") or {}
        uid = md["uid"]
        with self.lock:
            rp = self.runtimes.get(uid)
        if etype == "DELETED":
            if rp is not None:
                rp.stopping = True
                self._signal_all(rp, signal.SIGKILL)
                with self.lock:
                    self.runtimes.pop(uid, None)
                self.hosts_dirty.set()
            return
        if spec.get("nodeName") not in self.node_names:
            if not spec.get("nodeName"):
                self._bind(pod)
            return
        if md.get("deletionTimestamp"):
            if rp is None:
                self._confirm_delete(pod)
            elif not rp.stopping:
                rp.stopping = True
                threading.Thread(target=self._terminate, args=(rp, pod), daemon=True).start()
            return
        if rp is None and pod.get("status", {}).get("phase") not in ("Succeeded", "Failed"):
            self._start(pod)

    def _confirm_delete(self, pod):
        md = pod["metadata"]
        try:
            self.store.delete(self.pods_rt, md["namespace"], md["name"], grace=0,
                              preconditions={"uid": md["uid"]})
        except errors.ApiError:
            pass

    def _terminate(self, rp, pod):
        grace = pod["metadata"].get("deletionGracePeriodSeconds", 30)
        self._signal_all(rp, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while any(c.running() for c in rp.containers) and time.monotonic() < deadline:
            time.sleep(0.05)
        self._signal_all(rp, signal.SIGKILL)
        self._confirm_delete(pod)

    def allocate_cluster_ip(self):
        """A loopback address for a new Service, served by the proxy (127.<octet>.254.N)."""
        used = {(svc.get("spec") or {}).get("clusterIP")
                for svc in self.store.list(self.registry.lookup("", "v1", "services"))[0]}
        for n in range(1, 255):
            ip = "127.%d.254.%d" % (self.ip_octet, n)
            if ip not in used:
                return ip
        return None

    def _allocate_ip(self):
        with self.lock:
            used = {rp.ip for rp in self.runtimes.values()}   # adopted pods keep theirs
            while True:
                self.next_ip += 1
                n = self.next_ip
                ip = "127.%d.%d.%d" % (self.ip_octet, 1 + n // 254, 1 + n % 254)
                if ip not in used:
                    return ip

    def _start(self, pod):
        md = pod["metadata"]
        pod_dir = os.path.join(self.workdir, "pods", "%s_%s_%s" % (md["namespace"],
                                                                  md["name"], md["uid"]))
        os.makedirs(pod_dir, exist_ok=True)
        rp = PodRuntime(pod, self._allocate_ip(), pod_dir)
        rp.containers = [Container(c, os.path.join(pod_dir, c["name"] + ".log"), self.images is not None)
                         for c in pod["spec"].get("containers") or []]
        with self.lock:
            self.runtimes[rp.uid] = rp
        threading.Thread(target=self._run_pod, args=(rp, pod), name="pod-" + rp.name,
                         daemon=True).start()

    def _pod_env(self, rp):
        """What the kubelet adds to every container's environment."""
        env = {"HOSTNAME": rp.hostname}
        if self.api_url:
            hostport = self.api_url.split("://", 1)[-1]
            env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"] = hostport.rsplit(":", 1)
        return env

    def _base_env(self, rp):
        """Process mode: the stand-in's environment (the host is the image), its PATH
        additions, and the pod's directory (where its volumes live)."""
        env = dict(os.environ)
        env["PATH"] = ":".join(self.path_prepend + [os.environ.get("PATH", "/usr/bin:/bin")])
        env["STANDIN_POD_DIR"] = rp.dir
        env.update(self._pod_env(rp))
        return env

    def _adopt(self, pod):
        """A pod this node ran before the stand-in crashed: adopts the containers it had
        running, so they are not started again, and an end while it was down is reported
        (with the shim's code, or as killed when the shim died too). A pod whose containers
        the kubelet stopped (SIGTERM) starts anew."""
        md, st = pod["metadata"], pod.get("status") or {}
        if self.images is not None or (pod.get("spec") or {}).get("nodeName") not in self.node_names \
                or st.get("phase") != "Running" or not st.get("podIP"):
            return
        pod_dir = os.path.join(self.workdir, "pods", "%s_%s_%s" % (md["namespace"], md["name"], md["uid"]))
        statuses = {c.get("name"): c for c in st.get("containerStatuses") or []}
        rp = PodRuntime(pod, st["podIP"], pod_dir)
        rp.started = st.get("startTime") or rp.started
        adopted = 0
        for spec in pod["spec"].get("containers") or []:
            c = Container(spec, os.path.join(pod_dir, spec["name"] + ".log"))
            cs = statuses.get(spec["name"]) or {}
            c.restarts = cs.get("restartCount", 0)
            c.state, c.last_state = cs.get("state") or c.state, cs.get("lastState") or {}
            cid = cs.get("containerID") or ""
            if "terminated" in c.state:
                c.done = True
            elif cid.startswith("standin://") and "running" in c.state:
                # Running, or ended meanwhile: either way its end is reported as it was.
                c.proc = AdoptedProcess(int(cid[10:]), c.shim_base)
                adopted += 1
            rp.containers.append(c)
        if not adopted:
            return
        with self.lock:
            self.runtimes[rp.uid] = rp
        print("kubelet: adopted %d running container(s) of %s/%s" % (adopted, rp.ns, rp.name), flush=True)
        threading.Thread(target=self._run_pod, args=(rp, pod, True), name="pod-" + rp.name,
                         daemon=True).start()

    def _run_pod(self, rp, pod, adopted=False):
        """The pod worker: init containers in order, then the containers. An adopted pod's
        init containers are done and its running containers keep running."""
        lookup = podenv.Lookup(self.store, self.registry, rp.ns)
        pod = copy.deepcopy(pod)
        pod.setdefault("status", {})["podIP"] = rp.ip
        self._publish(rp)
        self.hosts_dirty.set()
        try:
            volumes = podenv.materialize_volumes(pod, rp.dir, lookup)
        except podenv.ConfigError as e:
            volumes = {}
            print("kubelet: %s/%s volumes: %s" % (rp.ns, rp.name, e), flush=True)
        if self.images is not None:
            # As a real kubelet makes them: any user of the image may write an emptyDir.
            for vol in pod["spec"].get("volumes") or []:
                if "emptyDir" in vol and vol.get("name") in volumes:
                    os.chmod(volumes[vol["name"]], 0o777)
        policy = pod["spec"].get("restartPolicy", "Always")
        for spec in [] if adopted else pod["spec"].get("initContainers") or []:
            c = Container(spec, os.path.join(rp.dir, "init-" + spec["name"] + ".log"), self.images is not None)
            rp.init = c
            code = self._launch(rp, pod, c, lookup, volumes)
            code = c.proc.wait() if c.proc else code
            rp.init = None
            if code != 0 or rp.stopping:
                for main in rp.containers:
                    main.state = {"waiting": {"reason": "PodInitializing"}}
                self._finish(rp, "Failed")
                return
        for c in rp.containers:
            if c.proc is None and not c.done:
                self._launch(rp, pod, c, lookup, volumes)
        self._publish(rp)
        while not rp.stopping and not self.stopped.is_set():
            changed = False
            for c in rp.containers:
                if c.done:
                    continue
                if c.proc is not None and c.proc.poll() is not None:
                    changed = True
                    c.exited(policy)
                elif c.proc is None and not c.done and time.monotonic() >= c.next_start:
                    changed = True
                    self._launch(rp, pod, c, lookup, volumes)
            if all(c.done for c in rp.containers):
                failed = any(c.state["terminated"]["exitCode"] != 0 for c in rp.containers)
                self._finish(rp, "Failed" if failed else "Succeeded")
                return
            for c in rp.containers:
                changed |= c.probe(rp.ip)
            if changed:
                self._publish(rp)
            time.sleep(0.05)
        # Stopping (deleted or kubelet exit): record the final states.
        for c in rp.containers:
            if c.proc is not None:
                c.proc.wait()
                c.exited("Never")
        self._publish(rp)

    def _launch(self, rp, pod, c, lookup, volumes):
        if rp.stopping or self.stopped.is_set():
            return None                        # deleted while starting
        if self.images is not None:
            return c.launch_in_image(self.images, pod, self._pod_env(rp), rp.dir, lookup, volumes)
        return c.launch_process(pod, self._base_env(rp), rp.dir, lookup, volumes)

    def _finish(self, rp, phase):
        rp.phase = phase
        self._publish(rp)
        self.hosts_dirty.set()

    # ---- status ----------------------------------------------------------------------
    def _publish(self, rp):
        with rp.lock:
            if rp.phase not in ("Succeeded", "Failed"):
                started = all(c.proc is not None or c.done for c in rp.containers)
                rp.phase = "Running" if started and rp.containers else "Pending"
            ready = rp.phase == "Running" and all(c.running() and c.probe_ok for c in rp.containers)

            def fn(pod):
                st = pod.setdefault("status", {})
                st["phase"] = rp.phase
                st["podIP"], st["podIPs"] = rp.ip, [{"ip": rp.ip}]
                st["hostIP"], st["hostIPs"] = "127.0.0.1", [{"ip": "127.0.0.1"}]
                st["startTime"] = rp.started
                st["containerStatuses"] = [c.status() for c in rp.containers]
                old = {c.get("type"): c for c in st.get("conditions") or []}
                conds = []
                for ctype, ok in (("PodReadyToStartContainers", True), ("Initialized", True),
                                  ("Ready", ready), ("ContainersReady", ready),
                                  ("PodScheduled", True)):
                    status = "True" if ok else "False"
                    prev = old.get(ctype) or {}
                    cond = {"type": ctype, "status": status,
                            "lastTransitionTime": prev.get("lastTransitionTime", now_iso())
                            if prev.get("status") == status else now_iso()}
                    if not ok and rp.phase in ("Succeeded", "Failed"):
                        cond["reason"] = "PodCompleted"
                    conds.append(cond)
                st["conditions"] = conds
                return pod
            try:
                self.store.mutate(self.pods_rt, rp.ns, rp.name, fn, "status")
            except errors.ApiError:
                pass                            # deleted meanwhile

    # ---- DNS -----------------------------------------------------------------------------
    def _write_hosts(self):
        with self.lock:
            rts = [rp for rp in self.runtimes.values()]
        entries = []
        by_ip = {}
        for rp in rts:
            if rp.phase not in ("Pending", "Running"):
                continue                        # nothing listens on a finished pod's IP
            names = []
            if rp.subdomain:
                base = "%s.%s.%s" % (rp.hostname, rp.subdomain, rp.ns)
                names += [base + ".svc.cluster.local", base + ".svc", base,
                          "%s.%s" % (rp.hostname, rp.subdomain)]
            by_ip[rp.ip] = names
        svc_rt = self.registry.lookup("", "v1", "services")
        for svc in self.store.list(svc_rt)[0]:
            sel = (svc.get("spec") or {}).get("selector")
            if not sel:
                continue
            ns, name = svc["metadata"]["namespace"], svc["metadata"]["name"]
            names = ["%s.%s.svc.cluster.local" % (name, ns), "%s.%s.svc" % (name, ns), "%s.%s" % (name, ns)]
            ip = svc["spec"].get("clusterIP") or ""
            if ip.startswith("127."):           # served by the proxy
                by_ip.setdefault(ip, []).extend(names)
                continue
            for rp in rts:
                if rp.ip in by_ip and rp.ns == ns and \
                        match_labels([(k, "=", [v]) for k, v in sel.items()], rp.labels):
                    by_ip[rp.ip] += ["%s.%s.svc.cluster.local" % (name, ns),
                                     "%s.%s.svc" % (name, ns), "%s.%s" % (name, ns)]
        for ip, names in sorted(by_ip.items()):
            entries.append((ip, names))
        self.hosts.update(entries)

    # ---- hooks for the HTTP layer -----------------------------------------------------------
    def _runtime(self, ns, name):
        with self.lock:
            for rp in self.runtimes.values():
                if rp.ns == ns and rp.name == name:
                    return rp
        return None

    def _signal_all(self, rp, sig, container=None):
        pids = []
        for c in rp.containers + ([rp.init] if rp.init else []):
            # Read once: the kubelet's loop clears c.proc when the process exits, which may
            # happen between a check and its use (faults.test_kill_replica once got a 500).
            proc = c.proc
            if (container is None or c.name == container) and proc is not None and proc.poll() is None:
                try:
                    os.killpg(proc.pid, sig)
                    pids.append(proc.pid)
                except OSError:
                    pass
        return pids

    def signal(self, ns, name, signame, container=None):
        rp = self._runtime(ns, name)
        if rp is None:
            raise errors.ApiError(404, "NotFound", 'no running pod "%s/%s"' % (ns, name))
        sig = SIGNALS.get(signame.upper().replace("SIG", ""))
        if sig is None:
            raise errors.bad_request("unknown signal %r" % signame)
        return self._signal_all(rp, sig, container)

    def processes(self):
        with self.lock:
            return {"%s/%s" % (rp.ns, rp.name): {
                "ip": rp.ip, "phase": rp.phase,
                "containers": {c.name: c.workload_pid() if c.running() else None
                               for c in rp.containers}} for rp in self.runtimes.values()}

    def log_path(self, pod, cname):
        md = pod["metadata"]
        path = os.path.join(self.workdir, "pods", "%s_%s_%s" % (
            md["namespace"], md["name"], md["uid"]), cname + ".log")
        return path if os.path.exists(path) else None

    def container_running(self, pod, cname):
        with self.lock:
            rp = self.runtimes.get(pod["metadata"]["uid"])
        return rp is not None and any(c.name == cname and (c.running() or not c.done)
                                      for c in rp.containers)
