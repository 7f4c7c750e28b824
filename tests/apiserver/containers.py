"""One container of the stand-in kubelet: how it starts (a local process under the shim,
or inside its image's root filesystem), how its readinessProbe runs, and how its end
becomes a container status (exit code, termination message, restart back-off).

The kubelet (kubelet.py) owns the pods: scheduling, the pod worker that calls these in
order, the pod status and the DNS entries."""
import copy
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import images as imagesmod
import podenv
from shim import read_exit as read_shim_exit, read_pid as read_shim_pid
from store import now_iso

BACKOFF_START, BACKOFF_MAX = 1.0, 10.0     # the real kubelet: 10 s doubling to 5 min
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # probes go to the pod
CHROOT_EXEC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "chroot_exec.py")
SHIM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "shim.py")


class Container:
    def __init__(self, spec, log_path, in_image=False):
        self.spec, self.name, self.log_path = spec, spec["name"], log_path
        self.proc = None
        self.restarts = 0
        self.state = {"waiting": {"reason": "ContainerCreating"}}
        self.last_state = {}
        self.next_start = 0.0
        self.done = False                    # terminated and not restarting
        self.image_id = ""                   # image mode: the image it runs
        process_mode = log_path.endswith(".log") and not in_image
        # terminationMessagePath on the host (process mode): emptied at each start, read
        # into the terminated state's message as the real kubelet does.
        self.term_path = log_path[:-len(".log")] + ".termination-log" if process_mode else None
        # The shim's status files (process mode): <base>.pid, <base>.exit.
        self.shim_base = log_path[:-len(".log")] + ".shim" if process_mode else None
        # readinessProbe (httpGet or tcpSocket): its last result, when it is due next.
        self.probe_spec = spec.get("readinessProbe") or {}
        self.probe_ok = not self.probe_spec
        self.probe_due = 0.0

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def workload_pid(self):
        """The container's own process (not its shim's), for /standin/processes."""
        if self.proc is None:
            return None
        pid = read_shim_pid(self.shim_base) if self.shim_base else None
        return pid or self.proc.pid

    # ---- start ---------------------------------------------------------------------------
    def start_error(self, message):
        self.state = {"terminated": {"exitCode": 128, "reason": "StartError", "message": message,
                                     "startedAt": now_iso(), "finishedAt": now_iso()}}
        self.done = True
        return 128

    def config_error(self, error, retry_s=1.0):
        self.state = {"waiting": {"reason": "CreateContainerConfigError", "message": str(error)}}
        self.next_start = time.monotonic() + retry_s

    def pull_failed(self, image):
        """A pull that cannot succeed: ErrImagePull, then ImagePullBackOff while the
        kubelet waits (1 s doubling to 10 s) before it tries again."""
        host = image.split("/", 1)[0].split(":", 1)[0] if "/" in image else ""
        self.pull_failures = getattr(self, "pull_failures", 0) + 1
        if self.pull_failures == 1:
            ref = image if ":" in image.rsplit("/", 1)[-1] else image + ":latest"
            self.state = {"waiting": {"reason": "ErrImagePull", "message": (
                'failed to pull and unpack image "%s": failed to resolve reference "%s": failed to do '
                'request: Head "https://%s/v2/": dial tcp: lookup %s: no such host' % (ref, ref, host, host))}}
        else:
            self.state = {"waiting": {"reason": "ImagePullBackOff",
                                      "message": 'Back-off pulling image "%s"' % image}}
        self.next_start = time.monotonic() + min(BACKOFF_MAX, BACKOFF_START * 2 ** (self.pull_failures - 1))

    def launch_process(self, pod, base_env, pod_dir, lookup, volumes):
        """Runs the container's command/args as a local process group under the shim, with
        volume paths translated to their host directories. An image from a registry whose
        host is under .invalid (a name that never resolves) cannot be pulled."""
        image = self.spec.get("image", "")
        if "/" in image and image.split("/", 1)[0].split(":", 1)[0].endswith(".invalid"):
            return self.pull_failed(image)
        mounts = podenv.mount_map(self.spec, volumes)
        if self.term_path:
            # The container's terminationMessagePath names this file in its arguments and
            # env values (no mount namespaces: translated like a volume's path).
            with open(self.term_path, "w"):
                pass
            mounts = [(self.spec.get("terminationMessagePath") or "/dev/termination-log", self.term_path)] + mounts
        try:
            argv, env = podenv.build(pod, self.spec, base_env, lookup, mounts)
        except podenv.ConfigError as e:
            return self.config_error(e)
        if not argv:
            return self.start_error("the stand-in kubelet runs command/args only (images are not run)")
        cwd = self.spec.get("workingDir")
        cwd = podenv.translate(cwd, mounts) if cwd else pod_dir
        if not os.path.isdir(cwd):
            cwd = pod_dir
        for suffix in (".pid", ".exit"):
            try:
                os.unlink(self.shim_base + suffix)
            except OSError:
                pass
        log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen([sys.executable, "-I", "-S", SHIM, self.shim_base, "--"] + argv,
                                         env=env, cwd=cwd, stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        except OSError as e:
            return self.start_error("shim: %s" % e.strerror)
        finally:
            log.close()
        self.state = {"running": {"startedAt": now_iso()}}
        return None

    def launch_in_image(self, images, pod, base_env, pod_dir, lookup, volumes):
        """Runs the container's command (or the image's ENTRYPOINT/CMD) inside the image's
        root filesystem with the pod's env (over the image's and base_env), volumes (bind
        mounts: no path translation), working directory and user."""
        try:
            img = images.get(self.spec.get("image", ""))
        except imagesmod.ImageError as e:
            self.state = {"waiting": {"reason": "ErrImagePull", "message": str(e)}}
            self.next_start = time.monotonic() + BACKOFF_MAX
            return None
        self.image_id = img.id
        spec = dict(self.spec)
        if not spec.get("command"):                # Kubernetes' ENTRYPOINT/CMD rules
            spec["command"] = list(img.entrypoint)
            if not spec.get("args"):
                spec["args"] = list(img.cmd)
        base = dict(e.split("=", 1) for e in img.env if "=" in e)
        base.update(base_env)
        try:
            argv, env = podenv.build(pod, spec, base, lookup, [])
            uid, gid, groups, home = image_user(pod, self.spec, img)
        except podenv.ConfigError as e:
            return self.config_error(e)
        if not argv:
            return self.start_error("no command: neither the container nor image %s sets one" % img.ref)
        env.setdefault("HOME", home)
        binds = []
        for m in self.spec.get("volumeMounts") or []:
            host = volumes.get(m.get("name"))
            if host is None:
                continue
            if m.get("subPath"):
                host = os.path.join(host, m["subPath"])
                os.makedirs(host, exist_ok=True)
            binds.append([host, m.get("mountPath", "/"), bool(m.get("readOnly"))])
        csc = self.spec.get("securityContext") or {}
        layer = os.path.join(pod_dir, "rootfs", "%s-%d" % (self.name, self.restarts))
        r, w = os.pipe()
        launch = {"rootfs": img.rootfs, "layer": layer,
                  "workdir": self.spec.get("workingDir") or img.workdir, "uid": uid, "gid": gid,
                  "groups": groups, "readOnlyRoot": bool(csc.get("readOnlyRootFilesystem")),
                  "binds": binds, "argv": argv, "statusFd": w}
        log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen([sys.executable, "-I", CHROOT_EXEC, json.dumps(launch)],
                                         env=env, cwd="/", stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         pass_fds=(w,))
        except OSError as e:
            os.close(r)
            return self.start_error("chroot_exec: %s" % e.strerror)
        finally:
            os.close(w)
            log.close()
        # Empty once the exec succeeded (the pipe closes on exec); else why it failed.
        with os.fdopen(r, "rb") as status:
            failure = status.read().decode(errors="replace")
        if failure:
            self.proc.wait()
            self.proc = None
            return self.start_error(failure)
        self.state = {"running": {"startedAt": now_iso()}}
        return None

    # ---- readiness -----------------------------------------------------------------------
    def probe(self, ip):
        """Runs a due readinessProbe (httpGet or tcpSocket against the pod's IP; exec counts
        as passing) of a running container; True when its readiness changed."""
        if not self.probe_spec:
            return False
        if not self.running():
            was, self.probe_ok = self.probe_ok, False
            self.probe_due = 0.0
            return was
        now = time.monotonic()
        if self.probe_due == 0.0:
            self.probe_due = now + float(self.probe_spec.get("initialDelaySeconds", 0))
        if now < self.probe_due:
            return False
        self.probe_due = now + float(self.probe_spec.get("periodSeconds", 10))
        timeout = float(self.probe_spec.get("timeoutSeconds", 1))
        ok = True
        target = self.probe_spec.get("httpGet") or self.probe_spec.get("tcpSocket")
        if target:
            port = target.get("port")
            if isinstance(port, str) and not port.isdigit():
                port = next((p.get("containerPort") for p in self.spec.get("ports") or []
                             if p.get("name") == port), None)
            try:
                if self.probe_spec.get("httpGet"):
                    url = "http://%s:%s%s" % (ip, port, target.get("path") or "/")
                    with _NO_PROXY.open(url, timeout=timeout) as r:
                        ok = 200 <= r.status < 400
                else:
                    socket.create_connection((ip, int(port)), timeout=timeout).close()
            except (OSError, ValueError, TypeError):
                ok = False
        was, self.probe_ok = self.probe_ok, ok
        return was != ok

    # ---- end -----------------------------------------------------------------------------
    def exited(self, policy):
        """Its process ended: records the terminated state, or with restartPolicy Always /
        OnFailure (and a failure) the last state and a back-off before the next start."""
        code = self.proc.returncode
        shim = read_shim_exit(self.shim_base) if self.shim_base else None
        if shim and shim[1]:
            self.proc = None
            return self.start_error(shim[1])
        started = self.state.get("running", {}).get("startedAt", now_iso())
        term = {"exitCode": code if code >= 0 else 128 - code,
                "reason": "Completed" if code == 0 else "Error",
                "startedAt": started, "finishedAt": now_iso(),
                "containerID": "standin://%d" % self.proc.pid}
        if code < 0:
            term["signal"] = -code
        message = self.termination_message(code)
        if message:
            term["message"] = message
        self.proc = None
        if policy == "Always" or (policy == "OnFailure" and code != 0):
            self.last_state = {"terminated": term}
            self.restarts += 1
            delay = min(BACKOFF_MAX, BACKOFF_START * 2 ** (self.restarts - 1))
            self.next_start = time.monotonic() + delay
            self.state = {"waiting": {"reason": "CrashLoopBackOff",
                                      "message": "back-off %ds restarting failed container" % delay}}
        else:
            self.state = {"terminated": term}
            self.done = True
        return None

    def termination_message(self, code):
        """The termination message file (at most 4 KiB), else with FallbackToLogsOnError and
        a failure the log's tail (at most 80 lines and 2 KiB), as the kubelet does."""
        text = ""
        if self.term_path:
            try:
                with open(self.term_path, "rb") as f:
                    text = f.read(4096).decode("utf-8", "replace")
            except OSError:
                pass
        if not text and code != 0 and self.spec.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            try:
                with open(self.log_path, "rb") as f:
                    f.seek(max(0, os.path.getsize(self.log_path) - 2048))
                    tail = f.read().decode("utf-8", "replace")
                text = "\n".join(tail.split("\n")[-81:])
            except OSError:
                pass
        return text

    def status(self):
        """Its entry of the pod's status.containerStatuses."""
        running = self.running()
        return {"name": self.name, "image": self.spec.get("image", ""), "imageID": self.image_id,
                "containerID": "standin://%d" % self.proc.pid if self.proc else "",
                "ready": running and self.probe_ok, "started": running, "restartCount": self.restarts,
                "state": copy.deepcopy(self.state), "lastState": copy.deepcopy(self.last_state)}


def image_user(pod, spec, img):
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
