"""Local kubelet: registers fake nodes, binds pending pods, runs each
container's command as a local process group with its own 127.x pod IP (on the host,
or with images=True inside its image's root filesystem), reports status, and stops
pods gracefully on deletion.

On the host each container runs under a shim (shim.py) that records how it ended, so
a kubelet started after a crash of the stand-in (SIGKILL) adopts the pods' processes
that are still running instead of starting them again: containers outlive a restart of
a real API server or kubelet too. A stand-in stopped with SIGTERM stops its pods."""
import copy
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import errors
import images as imagesmod
import podenv
import scheduler
from shim import AdoptedProcess, read_exit as read_shim_exit, read_pid as read_shim_pid
import urllib.request
from proxy import ServiceProxy
from hostsfile import HostsFile
from selection import match_labels
from store import now_iso

SIGNALS = {"KILL": signal.SIGKILL, "TERM": signal.SIGTERM, "STOP": signal.SIGSTOP,
           "CONT": signal.SIGCONT, "INT": signal.SIGINT, "HUP": signal.SIGHUP,
           "USR1": signal.SIGUSR1, "USR2": signal.SIGUSR2}
BACKOFF_START, BACKOFF_MAX = 1.0, 10.0     # the real kubelet: 10 s doubling to 5 min
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # probes go to the pod
CHROOT_EXEC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "chroot_exec.py")
SHIM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "shim.py")


class Container:
    def __init__(self, spec, log_path):
        self.spec, self.name, self.log_path = spec, spec["name"], log_path
        self.proc = None
        self.restarts = 0
        self.state = {"waiting": {"reason": "ContainerCreating"}}
        self.last_state = {}
        self.next_start = 0.0
        self.done = False                    # terminated and not restarting
        self.image_id = ""                   # image mode: the image it runs
        # terminationMessagePath on the host (process mode): emptied at each start, read
        # into the terminated state's message as the real kubelet does.
        self.term_path = log_path[:-len(".log")] + ".termination-log" if log_path.endswith(".log") else None
        # The shim's status files (process mode): <base>.pid, <base>.exit.
        self.shim_base = log_path[:-len(".log")] + ".shim" if log_path.endswith(".log") else None
        # readinessProbe (httpGet or tcpSocket): its last result, when it is due next.
        self.probe = spec.get("readinessProbe") or {}
        self.probe_ok = not self.probe
        self.probe_due = 0.0

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def workload_pid(self):
        """The container's own process (not its shim's), for /standin/processes."""
        if self.proc is None:
            return None
        pid = read_shim_pid(self.shim_base) if self.shim_base else None  # none in image mode
        return pid or self.proc.pid


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
    def __init__(self, store, registry, workdir=None, path_prepend=(), nodes=1, images=False):
        self.store, self.registry = store, registry
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
                           "capacity": {"cpu": str(os.cpu_count() or 1), "memory": "64Gi",
                                        "pods": "110"},
                           "allocatable": {"cpu": str(os.cpu_count() or 1),
                                           "memory": "64Gi", "pods": "110"},
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
        nodes = [self.store.find(self.registry.lookup("", "v1", "nodes"), "", n)
                 for n in self.node_names]
        pods = [p for p in self.store.list(self.pods_rt)[0]
                if p.get("status", {}).get("phase") not in ("Succeeded", "Failed")]
        node, reason = scheduler.choose_node(pod, [n for n in nodes if n], pods, self.rr)
        md = pod["metadata"]

        def bind(o):
            if o["spec"].get("nodeName"):
                return o
            if node:
                o["spec"]["nodeName"] = node
            return o

        def unschedulable(o):
            conds = [c for c in o.get("status", {}).get("conditions") or []
                     if c.get("type") != "PodScheduled"]
            conds.append({"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                          "message": reason, "lastTransitionTime": now_iso()})
            o.setdefault("status", {})["conditions"] = conds
            return o
        try:
            if node:
                self.rr += 1
                self.store.mutate(self.pods_rt, md["namespace"], md["name"], bind)
            elif not any(c.get("reason") == "Unschedulable"
                         for c in pod.get("status", {}).get("conditions") or []):
                self.store.mutate(self.pods_rt, md["namespace"], md["name"], unschedulable,
                                  "status")
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
        rp.containers = [Container(c, os.path.join(pod_dir, c["name"] + ".log"))
                         for c in pod["spec"].get("containers") or []]
        with self.lock:
            self.runtimes[rp.uid] = rp
        threading.Thread(target=self._run_pod, args=(rp, pod), name="pod-" + rp.name,
                         daemon=True).start()

    def _base_env(self, rp):
        env = dict(os.environ)
        env["PATH"] = ":".join(self.path_prepend + [os.environ.get("PATH", "/usr/bin:/bin")])
        env["HOSTNAME"] = rp.hostname
        env["STANDIN_POD_DIR"] = rp.dir
        if self.api_url:
            hostport = self.api_url.split("://", 1)[-1]
            env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"] = \
                hostport.rsplit(":", 1)
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
            c = Container(spec, os.path.join(rp.dir, "init-" + spec["name"] + ".log"))
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
                    self._exited(c, policy)
                elif c.proc is None and not c.done and time.monotonic() >= c.next_start:
                    changed = True
                    self._launch(rp, pod, c, lookup, volumes)
            if all(c.done for c in rp.containers):
                failed = any(c.state["terminated"]["exitCode"] != 0 for c in rp.containers)
                self._finish(rp, "Failed" if failed else "Succeeded")
                return
            for c in rp.containers:
                changed |= self._probe(rp, c)
            if changed:
                self._publish(rp)
            time.sleep(0.05)
        # Stopping (deleted or kubelet exit): record the final states.
        for c in rp.containers:
            if c.proc is not None:
                c.proc.wait()
                self._exited(c, "Never")
        self._publish(rp)

    def _launch(self, rp, pod, c, lookup, volumes):
        if rp.stopping or self.stopped.is_set():
            return None                        # deleted while starting
        if self.images is not None:
            return self._launch_in_image(rp, pod, c, lookup, volumes)
        mounts = podenv.mount_map(c.spec, volumes)
        if c.term_path:
            # The container's terminationMessagePath names this file in its arguments and
            # env values (no mount namespaces: translated like a volume's path).
            with open(c.term_path, "w"):
                pass
            mounts = [(c.spec.get("terminationMessagePath") or "/dev/termination-log", c.term_path)] + mounts
        try:
            argv, env = podenv.build(pod, c.spec, self._base_env(rp), lookup, mounts)
        except podenv.ConfigError as e:
            c.state = {"waiting": {"reason": "CreateContainerConfigError", "message": str(e)}}
            c.next_start = time.monotonic() + 1.0
            return None
        if not argv:
            return self._start_error(c, "the stand-in kubelet runs command/args only "
                                        "(images are not run)")
        cwd = c.spec.get("workingDir")
        cwd = podenv.translate(cwd, mounts) if cwd else rp.dir
        if not os.path.isdir(cwd):
            cwd = rp.dir
        for suffix in (".pid", ".exit"):
            try:
                os.unlink(c.shim_base + suffix)
            except OSError:
                pass
        log = open(c.log_path, "ab")
        try:
            c.proc = subprocess.Popen([sys.executable, "-I", "-S", SHIM, c.shim_base, "--"] + argv,
                                      env=env, cwd=cwd, stdout=log,
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      start_new_session=True)
        except OSError as e:
            log.close()
            return self._start_error(c, "shim: %s" % e.strerror)
        log.close()
        c.state = {"running": {"startedAt": now_iso()}}
        return None

    # ---- image mode ----------------------------------------------------------------------
    def _image_user(self, pod, spec, img):
        """(uid, gid, supplementary groups, home): the container's securityContext, then the
        pod's, then the image's USER; runAsNonRoot refuses uid 0 as the real kubelet does."""
        psc = pod["spec"].get("securityContext") or {}
        csc = spec.get("securityContext") or {}
        try:
            uid, gid, home = img.default_user()
        except imagesmod.ImageError as e:
            raise podenv.ConfigError(str(e))
        if csc.get("runAsUser", psc.get("runAsUser")) is not None:
            uid = int(csc.get("runAsUser", psc.get("runAsUser")))
            pw = img.passwd(str(uid))
            home = pw[2] if pw else "/"
            gid = pw[1] if pw and gid is None else gid
        if csc.get("runAsGroup", psc.get("runAsGroup")) is not None:
            gid = int(csc.get("runAsGroup", psc.get("runAsGroup")))
        if gid is None:
            gid = 0
        if csc.get("runAsNonRoot", psc.get("runAsNonRoot")) and uid == 0:
            raise podenv.ConfigError('container has runAsNonRoot and image will run as root '
                                     '(pod: "%s_%s", container: %s)' % (
                                         pod["metadata"]["name"], pod["metadata"]["namespace"], spec["name"]))
        groups = [gid] + [int(g) for g in psc.get("supplementalGroups") or []]
        if psc.get("fsGroup") is not None:
            groups.append(int(psc["fsGroup"]))
        return uid, gid, sorted(set(groups)), home

    def _launch_in_image(self, rp, pod, c, lookup, volumes):
        """Runs the container's command (or the image's ENTRYPOINT/CMD) inside the image's
        root filesystem with the pod's env, volumes (bind mounts: no path translation),
        working directory and user."""
        try:
            img = self.images.get(c.spec.get("image", ""))
        except imagesmod.ImageError as e:
            c.state = {"waiting": {"reason": "ErrImagePull", "message": str(e)}}
            c.next_start = time.monotonic() + BACKOFF_MAX
            return None
        c.image_id = img.id
        spec = dict(c.spec)
        if not spec.get("command"):                # Kubernetes' ENTRYPOINT/CMD rules
            spec["command"] = list(img.entrypoint)
            if not spec.get("args"):
                spec["args"] = list(img.cmd)
        base = dict(e.split("=", 1) for e in img.env if "=" in e)
        base["HOSTNAME"] = rp.hostname
        if self.api_url:
            hostport = self.api_url.split("://", 1)[-1]
            base["KUBERNETES_SERVICE_HOST"], base["KUBERNETES_SERVICE_PORT"] = hostport.rsplit(":", 1)
        try:
            argv, env = podenv.build(pod, spec, base, lookup, [])
            uid, gid, groups, home = self._image_user(pod, c.spec, img)
        except podenv.ConfigError as e:
            c.state = {"waiting": {"reason": "CreateContainerConfigError", "message": str(e)}}
            c.next_start = time.monotonic() + 1.0
            return None
        if not argv:
            return self._start_error(c, "no command: neither the container nor image %s sets one"
                                        % img.ref)
        env.setdefault("HOME", home)
        binds = []
        for m in c.spec.get("volumeMounts") or []:
            host = volumes.get(m.get("name"))
            if host is None:
                continue
            if m.get("subPath"):
                host = os.path.join(host, m["subPath"])
                os.makedirs(host, exist_ok=True)
            binds.append([host, m.get("mountPath", "/"), bool(m.get("readOnly"))])
        csc = c.spec.get("securityContext") or {}
        layer = os.path.join(rp.dir, "rootfs", "%s-%d" % (c.name, c.restarts))
        r, w = os.pipe()
        launch = {"rootfs": img.rootfs, "layer": layer,
                  "workdir": c.spec.get("workingDir") or img.workdir, "uid": uid, "gid": gid,
                  "groups": groups, "readOnlyRoot": bool(csc.get("readOnlyRootFilesystem")),
                  "binds": binds, "argv": argv, "statusFd": w}
        log = open(c.log_path, "ab")
        try:
            c.proc = subprocess.Popen([sys.executable, "-I", CHROOT_EXEC, json.dumps(launch)],
                                      env=env, cwd="/", stdout=log, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, start_new_session=True,
                                      pass_fds=(w,))
        except OSError as e:
            os.close(r)
            return self._start_error(c, "chroot_exec: %s" % e.strerror)
        finally:
            os.close(w)
            log.close()
        # Empty once the exec succeeded (the pipe closes on exec); else why it failed.
        with os.fdopen(r, "rb") as status:
            failure = status.read().decode(errors="replace")
        if failure:
            c.proc.wait()
            c.proc = None
            return self._start_error(c, failure)
        c.state = {"running": {"startedAt": now_iso()}}
        return None

    def _probe(self, rp, c):
        """Runs a due readinessProbe (httpGet or tcpSocket; exec counts as passing) of a
        running container; True when its readiness changed."""
        if not c.probe:
            return False
        if not c.running():
            was, c.probe_ok = c.probe_ok, False
            c.probe_due = 0.0
            return was
        now = time.monotonic()
        if c.probe_due == 0.0:
            c.probe_due = now + float(c.probe.get("initialDelaySeconds", 0))
        if now < c.probe_due:
            return False
        c.probe_due = now + float(c.probe.get("periodSeconds", 10))
        timeout = float(c.probe.get("timeoutSeconds", 1))
        ok = True
        target = c.probe.get("httpGet") or c.probe.get("tcpSocket")
        if target:
            port = target.get("port")
            if isinstance(port, str) and not port.isdigit():
                port = next((p.get("containerPort") for p in c.spec.get("ports") or [] if p.get("name") == port), None)
            try:
                if c.probe.get("httpGet"):
                    url = "http://%s:%s%s" % (rp.ip, port, target.get("path") or "/")
                    with _NO_PROXY.open(url, timeout=timeout) as r:
                        ok = 200 <= r.status < 400
                else:
                    socket.create_connection((rp.ip, int(port)), timeout=timeout).close()
            except (OSError, ValueError, TypeError):
                ok = False
        was, c.probe_ok = c.probe_ok, ok
        return was != ok

    def _start_error(self, c, message):
        c.state = {"terminated": {"exitCode": 128, "reason": "StartError", "message": message,
                                  "startedAt": now_iso(), "finishedAt": now_iso()}}
        c.done = True
        return 128

    def _exited(self, c, policy):
        code = c.proc.returncode
        shim = read_shim_exit(c.shim_base) if c.shim_base and self.images is None else None
        if shim and shim[1]:
            c.proc = None
            return self._start_error(c, shim[1])
        started = c.state.get("running", {}).get("startedAt", now_iso())
        term = {"exitCode": code if code >= 0 else 128 - code,
                "reason": "Completed" if code == 0 else "Error",
                "startedAt": started, "finishedAt": now_iso(),
                "containerID": "standin://%d" % c.proc.pid}
        if code < 0:
            term["signal"] = -code
        message = self._termination_message(c, code)
        if message:
            term["message"] = message
        c.proc = None
        if policy == "Always" or (policy == "OnFailure" and code != 0):
            c.last_state = {"terminated": term}
            c.restarts += 1
            delay = min(BACKOFF_MAX, BACKOFF_START * 2 ** (c.restarts - 1))
            c.next_start = time.monotonic() + delay
            c.state = {"waiting": {"reason": "CrashLoopBackOff",
                                   "message": "back-off %ds restarting failed container"
                                              % delay}}
        else:
            c.state = {"terminated": term}
            c.done = True

    def _termination_message(self, c, code):
        """The termination message file (at most 4 KiB), else with FallbackToLogsOnError and
        a failure the log's tail (at most 80 lines and 2 KiB), as the kubelet does."""
        text = ""
        if c.term_path and self.images is None:
            try:
                with open(c.term_path, "rb") as f:
                    text = f.read(4096).decode("utf-8", "replace")
            except OSError:
                pass
        if not text and code != 0 and c.spec.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            try:
                with open(c.log_path, "rb") as f:
                    f.seek(max(0, os.path.getsize(c.log_path) - 2048))
                    tail = f.read().decode("utf-8", "replace")
                text = "\n".join(tail.split("\n")[-81:])
            except OSError:
                pass
        return text

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
                st["containerStatuses"] = [self._cstatus(c) for c in rp.containers]
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

    def _cstatus(self, c):
        running = c.running()
        return {"name": c.name, "image": c.spec.get("image", ""), "imageID": c.image_id,
                "containerID": "standin://%d" % c.proc.pid if c.proc else "",
                "ready": running and c.probe_ok, "started": running, "restartCount": c.restarts,
                "state": copy.deepcopy(c.state), "lastState": copy.deepcopy(c.last_state)}

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
            if (container is None or c.name == container) and c.running():
                try:
                    os.killpg(c.proc.pid, sig)
                    pids.append(c.proc.pid)
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
