"""What a real cluster does to a controller that the stand-in produces on request: pods
that never start (an image that cannot be pulled, requests no node fits, a claim that
never binds or does not exist, a missing Secret key, a quota that refuses the create, a
scheduling gate nobody removes), garbage collection that lags behind the owner's
deletion, and a count of every write a client makes."""
import json
import time
import urllib.parse

from standin_fixture import StandInCase

PODS = "/api/v1/namespaces/default/pods"


def pod(name, **spec):
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": dict({"restartPolicy": "Never", "containers": [{
                "name": "main", "image": "ignored", "command": ["sh", "-c", "sleep 30"]}]}, **spec)}
    return body


class PodsThatNeverStart(StandInCase):
    extra_args = ("--kubelet", "--node-capacity", "cpu=2,memory=4Gi", "--storage-class", "fast", "--kueue-gate")

    def create(self, body):
        code, out = self.s.api("POST", PODS, body)
        self.assertEqual(code, 201, out)

    def get(self, name):
        return self.s.api("GET", PODS + "/" + name)[1]

    def waiting(self, name, want):
        """The container's waiting reason once it is `want`."""
        def fn():
            for cs in self.get(name).get("status", {}).get("containerStatuses") or []:
                w = (cs.get("state") or {}).get("waiting") or {}
                if w.get("reason") == want:
                    return w
        return self.s.wait_for(fn, 15, what="%s waiting %s" % (name, want))

    def scheduled_false(self, name):
        def fn():
            for c in self.get(name).get("status", {}).get("conditions") or []:
                if c["type"] == "PodScheduled" and c["status"] == "False":
                    return c
        return self.s.wait_for(fn, 15, what="%s PodScheduled False" % name)

    def test_image_that_cannot_be_pulled(self):
        body = pod("pull")
        body["spec"]["containers"][0]["image"] = "registry.example.invalid/team/trainer:1"
        self.create(body)
        w = self.waiting("pull", "ErrImagePull")
        self.assertIn("lookup registry.example.invalid: no such host", w["message"])
        w = self.waiting("pull", "ImagePullBackOff")
        self.assertEqual(w["message"], 'Back-off pulling image "registry.example.invalid/team/trainer:1"')
        self.assertEqual(self.get("pull")["status"]["phase"], "Pending")

    def test_requests_no_node_fits(self):
        body = pod("big")
        body["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "3", "nvidia.com/gpu": "1"}}
        self.create(body)
        c = self.scheduled_false("big")
        self.assertEqual(c["reason"], "Unschedulable")
        self.assertIn("0/1 nodes are available: 1 Insufficient cpu, 1 Insufficient nvidia.com/gpu.", c["message"])
        # What fits runs; two of them take the node's 2 cpus, a third does not fit.
        for n in ("fit-a", "fit-b", "fit-c"):
            body = pod(n)
            body["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1"}}
            self.create(body)
        self.s.wait_for(lambda: all(self.get(n)["spec"].get("nodeName") for n in ("fit-a", "fit-b")), 15)
        self.assertIn("1 Insufficient cpu", self.scheduled_false("fit-c")["message"])
        for n in ("fit-a", "fit-b", "fit-c", "big"):
            self.s.api("DELETE", PODS + "/" + n + "?gracePeriodSeconds=0")

    def test_claims_unbound_or_missing(self):
        claims = "/api/v1/namespaces/default/persistentvolumeclaims"
        for name, cls in (("bound", "fast"), ("never", "nfs-client")):
            code, out = self.s.api("POST", claims, {
                "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
                "spec": {"storageClassName": cls, "accessModes": ["ReadWriteMany"],
                         "resources": {"requests": {"storage": "1Gi"}}}})
            self.assertEqual(code, 201, out)
        self.assertEqual(self.s.api("GET", claims + "/bound")[1]["status"]["phase"], "Bound")
        self.assertEqual(self.s.api("GET", claims + "/never")[1]["status"]["phase"], "Pending")
        for name, claim in (("on-bound", "bound"), ("on-never", "never"), ("on-missing", "nope")):
            self.create(pod(name, volumes=[{"name": "v", "persistentVolumeClaim": {"claimName": claim}}]))
        self.s.wait_for(lambda: self.get("on-bound")["spec"].get("nodeName"), 15)
        self.assertIn("pod has unbound immediate PersistentVolumeClaims", self.scheduled_false("on-never")["message"])
        self.assertIn('persistentvolumeclaim "nope" not found', self.scheduled_false("on-missing")["message"])

    def test_missing_secret_key(self):
        body = pod("cfg")
        body["spec"]["containers"][0]["env"] = [
            {"name": "T", "valueFrom": {"secretKeyRef": {"name": "gone", "key": "token"}}}]
        self.create(body)
        w = self.waiting("cfg", "CreateContainerConfigError")
        self.assertIn('secret "gone" not found', w["message"])

    def test_scheduling_gate(self):
        body = pod("queued")
        body["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team"}
        self.create(body)
        self.assertEqual(self.get("queued")["spec"]["schedulingGates"], [{"name": "kueue.x-k8s.io/admission"}])
        self.assertEqual(self.scheduled_false("queued")["reason"], "SchedulingGated")
        # Removing the gate (what Kueue does on admission) lets it run.
        code, out = self.s.api("PATCH", PODS + "/queued", {"spec": {"schedulingGates": None}},
                               "application/merge-patch+json")
        self.assertEqual(code, 200, out)
        self.s.wait_for(lambda: self.get("queued")["spec"].get("nodeName"), 15, what="gate removed, scheduled")


class QuotaAndWrites(StandInCase):
    extra_args = ()

    def test_quota_refuses_the_create(self):
        code, out = self.s.api("POST", "/api/v1/namespaces/default/resourcequotas", {
            "apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "small"},
            "spec": {"hard": {"pods": "1", "requests.cpu": "1"}}})
        self.assertEqual(code, 201, out)
        self.assertEqual(self.s.api("POST", PODS, pod("one"))[0], 201)
        code, out = self.s.api("POST", PODS, pod("two"))
        self.assertEqual(code, 403, out)
        self.assertEqual(out["message"], 'pods "two" is forbidden: exceeded quota: small, requested: pods=1, '
                                         'used: pods=1, limited: pods=1')
        res = self.kubectl("run", "three", "--image=x", "--restart=Never", check=False)
        self.assertIn("exceeded quota: small", res.stderr)
        self.s.api("DELETE", "/api/v1/namespaces/default/resourcequotas/small")

    def test_writes_are_counted(self):
        t0 = time.time()
        self.s.api("POST", "/api/v1/namespaces/default/configmaps",
                   {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "w"}, "data": {"a": "1"}},
                   headers={"User-Agent": "writer/1"})
        self.s.api("PATCH", "/api/v1/namespaces/default/configmaps/w", {"data": {"a": "2"}},
                   "application/merge-patch+json", headers={"User-Agent": "writer/1"})
        self.s.api("GET", "/api/v1/namespaces/default/configmaps/w")
        self.s.api("DELETE", "/api/v1/namespaces/default/configmaps/nothere")
        code, writes = self.s.api("GET", "/standin/writes?resource=configmaps&since=%f" % t0)
        self.assertEqual(code, 200)
        self.assertEqual([(w["verb"], w["name"], w["userAgent"], w["code"]) for w in writes],
                         [("create", "", "writer/1", 200), ("patch", "w", "writer/1", 200),
                          ("delete", "nothere", writes[2]["userAgent"], 404)])


class LaggingGarbageCollector(StandInCase):
    extra_args = ("--gc-delay", "3")

    def test_dependents_outlive_their_owner(self):
        cms = "/api/v1/namespaces/default/configmaps"
        code, owner = self.s.api("POST", cms, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owner"}})
        self.assertEqual(code, 201)
        ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"],
               "controller": True}
        self.s.api("POST", cms, {"apiVersion": "v1", "kind": "ConfigMap",
                                 "metadata": {"name": "child", "ownerReferences": [ref]}})
        self.s.api("DELETE", cms + "/owner")
        t0 = time.monotonic()
        time.sleep(1.5)
        self.assertEqual(self.s.api("GET", cms + "/child")[0], 200, "collected before --gc-delay")
        self.s.wait_for(lambda: self.s.api("GET", cms + "/child")[0] == 404, 10, what="child collected")
        self.assertGreaterEqual(time.monotonic() - t0, 2.5)
