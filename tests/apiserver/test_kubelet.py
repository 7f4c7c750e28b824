"""The local kubelet: pods as processes, exit codes, restarts, fault hooks,
graceful deletion, env resolution, scheduling and pod DNS names."""
import json
import os
import shutil
import signal
import socket
import tempfile
import time
import unittest

from standin_fixture import FIXTURES, StandIn, StandInCase

PODS = "/api/v1/namespaces/default/pods"


def pod(name, script, policy="Never", **spec):
    body = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"test": name}},
            "spec": dict({"restartPolicy": policy, "containers": [{
                "name": "main", "image": "ignored", "command": ["sh", "-c", script]}]},
                **spec)}
    return json.dumps(body)


class KubeletTest(StandInCase):
    extra_args = ("--kubelet", "--nodes", "3", "--path-prepend", os.path.join(FIXTURES, "bin"))

    def get_pod(self, name):
        code, obj = self.s.api("GET", PODS + "/" + name)
        return obj if code == 200 else None

    def wait_phase(self, name, phase, timeout=15):
        return self.s.wait_for(lambda: (self.get_pod(name) or {}).get("status", {}).get(
            "phase") == phase and self.get_pod(name), timeout, what="%s %s" % (name, phase))

    def test_exit_code_fails_pod(self):
        self.kubectl("apply", "-f", "-", input=pod("exit3", "echo hi; exit 3"))
        obj = self.wait_phase("exit3", "Failed")
        term = obj["status"]["containerStatuses"][0]["state"]["terminated"]
        self.assertEqual((term["exitCode"], term["reason"]), (3, "Error"))
        self.assertEqual(self.kubectl("logs", "exit3").stdout, "hi\n")
        self.assertIn("Error", self.kubectl("get", "pod", "exit3").stdout)

    def test_termination_message(self):
        # The file named by terminationMessagePath (arguments name it as in a container).
        body = json.loads(pod("termfile", 'echo "{\\"ok\\": 1}" > "$0"; exit 2'))
        body["spec"]["containers"][0]["command"].append("/dev/termination-log")
        self.kubectl("apply", "-f", "-", input=json.dumps(body))
        term = self.wait_phase("termfile", "Failed")["status"]["containerStatuses"][0]["state"]["terminated"]
        self.assertEqual((term["exitCode"], term["message"]), (2, '{"ok": 1}\n'))
        # FallbackToLogsOnError: an empty file and a failure leave the log's last 80 lines.
        body = json.loads(pod("termlog", "seq 1 100; exit 1"))
        body["spec"]["containers"][0]["terminationMessagePolicy"] = "FallbackToLogsOnError"
        self.kubectl("apply", "-f", "-", input=json.dumps(body))
        term = self.wait_phase("termlog", "Failed")["status"]["containerStatuses"][0]["state"]["terminated"]
        self.assertEqual(term["message"], "".join("%d\n" % i for i in range(21, 101)))
        # Without the policy, or on success, a log is not a message.
        self.kubectl("apply", "-f", "-", input=pod("nolog", "echo x; exit 1"))
        term = self.wait_phase("nolog", "Failed")["status"]["containerStatuses"][0]["state"]["terminated"]
        self.assertNotIn("message", term)

    def test_success_and_env(self):
        self.kubectl("apply", "-f", "-", input=json.dumps({
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "envcm"},
            "data": {"greeting": "hello"}}))
        body = json.loads(pod("envpod", 'echo "$NAME $NS $GREETING $IP $(NAME) $HOSTNAME"'))
        body["spec"]["containers"][0]["env"] = [
            {"name": "NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "GREETING", "valueFrom": {"configMapKeyRef": {"name": "envcm",
                                                                   "key": "greeting"}}}]
        self.kubectl("apply", "-f", "-", input=json.dumps(body))
        obj = self.wait_phase("envpod", "Succeeded")
        ip = obj["status"]["podIP"]
        self.assertTrue(ip.startswith("127."))
        self.assertEqual(self.kubectl("logs", "envpod").stdout.strip(),
                         "envpod default hello %s envpod envpod" % ip)

    def test_path_prepend_and_config_volume(self):
        self.kubectl("apply", "-f", "-", input=json.dumps({
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "volcm"},
            "data": {"config.yaml": "steps: 3\n"}}))
        body = json.loads(pod("voltool", ""))
        body["spec"]["containers"] = [
            {"name": "tool", "image": "x", "command": ["standin-hello"]},
            {"name": "cat", "image": "x", "command": ["cat", "/etc/edit/config.yaml"],
             "volumeMounts": [{"name": "cfg", "mountPath": "/etc/edit"}]}]
        body["spec"]["volumes"] = [{"name": "cfg", "configMap": {"name": "volcm"}}]
        self.kubectl("apply", "-f", "-", input=json.dumps(body))
        self.wait_phase("voltool", "Succeeded")
        self.assertEqual(self.kubectl("logs", "voltool", "-c", "tool").stdout,
                         "hello from voltool\n")
        self.assertEqual(self.kubectl("logs", "voltool", "-c", "cat").stdout, "steps: 3\n")

    def test_killed_by_fault_hook_then_restarted(self):
        self.kubectl("apply", "-f", "-", input=pod("sleeper", "sleep 600", "OnFailure"))
        self.wait_phase("sleeper", "Running")
        code, res = self.s.api("POST", "/standin/kill?namespace=default&pod=sleeper&signal=KILL")
        self.assertEqual(code, 200)
        self.assertEqual(len(res["signalled"]), 1)
        obj = self.s.wait_for(lambda: (self.get_pod("sleeper")["status"]["containerStatuses"]
                                       [0]["restartCount"] == 1) and self.get_pod("sleeper"),
                              what="restart")
        last = obj["status"]["containerStatuses"][0]["lastState"]["terminated"]
        self.assertEqual(last["exitCode"], 137)
        self.kubectl("delete", "pod", "sleeper", "--grace-period=1")

    def start_trapping_pod(self, name, on_term):
        """A pod whose shell traps SIGTERM with on_term, once that trap is set (its script
        then touches <tmp>/<name>.trapped). Running only says the process started: a
        SIGTERM that comes before the trap (or, under load, before the shim's own handlers)
        ends it at once, as it would end a real container that had not installed its
        handler yet."""
        ready = os.path.join(self.s.tmp, name + ".trapped")
        script = "trap %s TERM; touch %s; while true; do sleep 0.1; done" % (on_term, ready)
        self.kubectl("apply", "-f", "-", input=pod(name, script))
        self.wait_phase(name, "Running")
        self.s.wait_for(lambda: os.path.exists(ready), what="%s trapped SIGTERM" % name)

    def test_graceful_delete_sends_sigterm(self):
        marker = os.path.join(self.s.tmp, "got-term")
        self.start_trapping_pod("graceful", '"echo term > %s; exit 0"' % marker)
        self.kubectl("delete", "pod", "graceful", "--grace-period=10", "--wait=false")
        self.s.wait_for(lambda: self.get_pod("graceful") is None, what="pod gone")
        with open(marker) as f:
            self.assertEqual(f.read().strip(), "term")
        # A process that ignores SIGTERM is killed after the grace period.
        self.start_trapping_pod("stubborn", '""')
        start = time.monotonic()
        self.kubectl("delete", "pod", "stubborn", "--grace-period=2", "--wait=false")
        self.assertIn("Terminating", self.kubectl("get", "pod", "stubborn").stdout)
        self.s.wait_for(lambda: self.get_pod("stubborn") is None, what="pod killed")
        self.assertGreaterEqual(time.monotonic() - start, 1.8)

    @unittest.skipUnless(os.access("/etc/hosts", os.W_OK), "needs a writable /etc/hosts")
    def test_dns_names_resolve_to_pod_ip(self):
        # /etc/hosts is shared by every stand-in on the machine: unique names.
        svc, name = "dnsjob%d" % self.s.port, "dns%d-0" % self.s.port
        self.kubectl("apply", "-f", "-", input=json.dumps({
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": svc},
            "spec": {"clusterIP": "None", "selector": {"test": name}}}))
        self.kubectl("apply", "-f", "-", input=pod(name, "sleep 600", hostname=name,
                                                   subdomain=svc))
        ip = self.wait_phase(name, "Running")["status"]["podIP"]
        for host in ("%s.%s.default.svc.cluster.local" % (name, svc), "%s.%s" % (name, svc),
                     "%s.default.svc" % svc):
            got = self.s.wait_for(lambda: _resolve(host), what="resolve " + host)
            self.assertEqual(got, ip)
        self.kubectl("delete", "pod", name, "--grace-period=1")
        self.s.wait_for(lambda: _resolve("%s.%s" % (name, svc)) is None, what="name removed")

    def test_anti_affinity_spreads_pods(self):
        anti = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
            "topologyKey": "kubernetes.io/hostname",
            "labelSelector": {"matchLabels": {"group": "spread"}}}]}}
        for i in range(3):
            body = json.loads(pod("spread-%d" % i, "sleep 600", affinity=anti))
            body["metadata"]["labels"]["group"] = "spread"
            self.kubectl("apply", "-f", "-", input=json.dumps(body))
            self.wait_phase("spread-%d" % i, "Running")
        nodes = {self.get_pod("spread-%d" % i)["spec"]["nodeName"] for i in range(3)}
        self.assertEqual(len(nodes), 3)
        body = json.loads(pod("spread-3", "sleep 600", affinity=anti))
        body["metadata"]["labels"]["group"] = "spread"
        self.kubectl("apply", "-f", "-", input=json.dumps(body))
        time.sleep(1.5)
        p = self.get_pod("spread-3")
        self.assertEqual(p["status"]["phase"], "Pending")
        self.assertNotIn("nodeName", p["spec"])
        self.kubectl("delete", "pod", "-l", "group=spread", "--grace-period=1")

    def test_readiness_probe_and_service_proxy(self):
        """A Service with a cluster IP forwards to the Ready pods it selects, at the named
        target port; Ready follows the pod's readinessProbe; relabelling a pod moves the
        traffic."""
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            free = s.getsockname()[1]
        svc_port = free
        script = ("mkdir -p d && echo %s > d/whoami && cd d && "
                  "exec python3 -m http.server --bind $(POD_IP) %d")
        for name in ("web-a", "web-b"):
            body = json.loads(pod(name, "", policy="Always"))
            c = body["spec"]["containers"][0]
            c["command"] = ["sh", "-c", script % (name, free)]
            c["env"] = [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
            c["ports"] = [{"name": "http", "containerPort": free}]
            c["readinessProbe"] = {"httpGet": {"path": "/whoami", "port": "http"}, "periodSeconds": 1}
            body["metadata"]["labels"] = {"app": "web", "serves": "yes" if name == "web-a" else "no"}
            self.kubectl("apply", "-f", "-", input=json.dumps(body))
        svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
               "spec": {"selector": {"app": "web", "serves": "yes"},
                        "ports": [{"port": svc_port, "targetPort": "http"}]}}
        self.kubectl("apply", "-f", "-", input=json.dumps(svc))
        ip = self.s.api("GET", "/api/v1/namespaces/default/services/web")[1]["spec"]["clusterIP"]
        self.assertTrue(ip.startswith("127."), ip)
        ready = lambda n: any(c["type"] == "Ready" and c["status"] == "True"
                              for c in (self.get_pod(n) or {}).get("status", {}).get("conditions", []))
        self.s.wait_for(lambda: ready("web-a") and ready("web-b"), timeout=20, what="both Ready by their probe")
        self.assertEqual(self.s.wait_for(lambda: _resolve("web.default.svc.cluster.local"), what="DNS"), ip)

        def who():
            try:
                with socket.create_connection(("web.default.svc", svc_port), timeout=3) as c:
                    c.sendall(b"GET /whoami HTTP/1.0\r\n\r\n")
                    data = b""
                    while True:
                        chunk = c.recv(4096)
                        if not chunk:
                            break
                        data += chunk
                return data.decode().strip().rsplit("\n", 1)[-1] if data else None
            except OSError:
                return None
        self.assertEqual(self.s.wait_for(who, what="the proxy answering"), "web-a")
        self.kubectl("label", "pod", "web-a", "serves=no", "--overwrite")
        self.kubectl("label", "pod", "web-b", "serves=yes", "--overwrite")
        self.assertEqual(self.s.wait_for(lambda: who() == "web-b" and "web-b", what="traffic moved"), "web-b")
        # A failing probe makes the pod unready: no endpoint is left.
        self.s.api("POST", "/standin/kill?namespace=default&pod=web-b&signal=STOP")
        self.s.wait_for(lambda: not ready("web-b"), timeout=20, what="web-b unready")
        self.assertIsNone(who())
        self.s.api("POST", "/standin/kill?namespace=default&pod=web-b&signal=CONT")
        self.kubectl("delete", "pod", "web-a", "web-b", "--grace-period=1")


class KubeletCrashTest(unittest.TestCase):
    """A stand-in that crashes (SIGKILL) and starts again on the same state and kubelet
    directory adopts the processes of its running pods, as containers survive a restart
    of a real API server or kubelet: nothing is started twice, and the ends of processes
    that exit after the restart (or while it was down) are reported with their codes."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="standin-crash-")
        self.s = StandIn("--kubelet", "--kubelet-workdir", os.path.join(self.tmp, "kubelet"),
                         state=os.path.join(self.tmp, "state.json"), tmp=self.tmp)

    def tearDown(self):
        self.s.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def status(self, name):
        code, obj = self.s.api("GET", PODS + "/" + name)
        return obj["status"] if code == 200 else {}

    def test_running_pods_are_adopted_not_restarted(self):
        release = os.path.join(self.tmp, "release")
        # "waiter" exits 3 once `release` exists; "early" exits 4 while the stand-in is down.
        script = 'echo started; while [ ! -e %s ]; do sleep 0.05; done; exit 3' % release
        self.s.kubectl("apply", "-f", "-", input=pod("waiter", script))
        self.s.kubectl("apply", "-f", "-", input=pod("early", 'echo started; while [ ! -e %s.early ]; do '
                                                              'sleep 0.05; done; exit 4' % release))
        for name in ("waiter", "early"):
            self.s.wait_for(lambda: self.status(name).get("phase") == "Running", what=name + " Running")
        before = {n: self.status(n) for n in ("waiter", "early")}
        pids = self.s.api("GET", "/standin/processes")[1]
        self.crash_and_restart_with(lambda: open(release + ".early", "w").close())
        # Adopted: the same container (same shim pid, same IP, no restart), running still.
        after = self.status("waiter")
        self.assertEqual(after["phase"], "Running")
        self.assertEqual(after["podIP"], before["waiter"]["podIP"])
        cs = after["containerStatuses"][0]
        self.assertEqual((cs["containerID"], cs["restartCount"]),
                         (before["waiter"]["containerStatuses"][0]["containerID"], 0))
        self.assertEqual(self.s.api("GET", "/standin/processes")[1]["default/waiter"],
                         pids["default/waiter"])
        # The one that ended while the stand-in was down is reported with its code.
        self.s.wait_for(lambda: self.status("early").get("phase") == "Failed", what="early Failed")
        self.assertEqual(self.status("early")["containerStatuses"][0]["state"]["terminated"]["exitCode"], 4)
        # The adopted process's end reaches the API with its exit code.
        open(release, "w").close()
        self.s.wait_for(lambda: self.status("waiter").get("phase") == "Failed", what="waiter Failed")
        term = self.status("waiter")["containerStatuses"][0]["state"]["terminated"]
        self.assertEqual((term["exitCode"], term["reason"]), (3, "Error"))
        self.assertEqual(self.s.kubectl("logs", "waiter").stdout, "started\n")  # started once

    def crash_and_restart_with(self, while_down):
        self.s.proc.send_signal(signal.SIGKILL)
        self.s.proc.wait()
        self.s.log.close()
        while_down()
        time.sleep(0.5)
        self.s.start()

    def test_a_process_killed_while_down_is_reported_killed(self):
        self.s.kubectl("apply", "-f", "-", input=pod("victim", "sleep 600"))
        self.s.wait_for(lambda: self.status("victim").get("phase") == "Running", what="Running")
        pid = self.s.api("GET", "/standin/processes")[1]["default/victim"]["containers"]["main"]
        cid = self.status("victim")["containerStatuses"][0]["containerID"]
        self.crash_and_restart_with(lambda: os.killpg(int(cid[len("standin://"):]), signal.SIGKILL))
        self.s.wait_for(lambda: self.status("victim").get("phase") == "Failed", what="victim Failed")
        self.assertEqual(self.status("victim")["containerStatuses"][0]["state"]["terminated"]["exitCode"], 137)
        self.assertFalse(os.path.exists("/proc/%d" % pid) and open("/proc/%d/stat" % pid).read().split()[2] != "Z")


def _resolve(name):
    try:
        return socket.getaddrinfo(name, None, socket.AF_INET)[0][4][0]
    except socket.gaierror:
        return None


if __name__ == "__main__":
    unittest.main()
