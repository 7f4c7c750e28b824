"""CRDs, custom resources and core API semantics, driven with real kubectl."""
import http.client
import json
import os
import time
import unittest

from standin_fixture import FIXTURES, StandInCase

WIDGET = """apiVersion: test.edit.io/v1alpha1
kind: Widget
metadata:
  name: %(name)s
spec:
  replicas: %(replicas)s
  algorithm:
    mode: %(mode)s
%(extra)s"""


def widget(name="w1", replicas=2, mode="edit", extra=""):
    return WIDGET % {"name": name, "replicas": replicas, "mode": mode, "extra": extra}


class CustomResourceTest(StandInCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.s.kubectl("apply", "-f", os.path.join(FIXTURES, "widget-crd.yaml"))
        cls.s.kubectl("wait", "--for=condition=Established", "--timeout=10s",
                      "crd/widgets.test.edit.io")

    def test_apply_get_printer_columns(self):
        self.kubectl("apply", "-f", "-", input=widget("cols", 3, "ddp"))
        out = self.kubectl("get", "wg", "cols").stdout.splitlines()
        self.assertEqual(out[0].split(), ["NAME", "REPLICAS", "MODE", "PHASE", "READY", "AGE"])
        self.assertEqual(out[1].split()[:3], ["cols", "3", "ddp"])
        # Defaults from the schema are applied.
        obj = json.loads(self.kubectl("get", "widget", "cols", "-o", "json").stdout)
        self.assertEqual(obj["spec"]["size"], "small")
        self.assertEqual(obj["metadata"]["generation"], 1)

    def test_explain_prints_descriptions(self):
        out = self.kubectl("explain", "widget.spec.algorithm").stdout
        self.assertIn("Training algorithm of the widget.", out)
        self.assertIn("Synchronization mode of the algorithm.", out)
        out = self.kubectl("explain", "wg.spec.replicas").stdout
        self.assertIn("Number of widget replicas.", out)

    def test_invalid_objects_name_the_field(self):
        res = self.kubectl("apply", "-f", "-", input=widget("bad", 0), check=False)
        self.assertNotEqual(res.returncode, 0)
        self.assertIn("spec.replicas: Invalid value: 0: spec.replicas in body should be "
                      "greater than or equal to 1", res.stderr)
        res = self.kubectl("apply", "-f", "-", input=widget("bad", 2, "bogus"), check=False)
        self.assertIn('spec.algorithm.mode: Unsupported value: "bogus"', res.stderr)
        res = self.kubectl("apply", "-f", "-", input=widget("bad", 2, "a-edit"), check=False)
        self.assertIn("spec.algorithm: Invalid value: \"object\": mode a-edit needs "
                      "syncSeconds", res.stderr)
        res = self.kubectl("apply", "-f", "-", input=widget("bad", 2, "edit", "  colour: red\n"),
                           check=False)
        self.assertIn('unknown field "spec.colour"', res.stderr)
        # The same object passes once valid; CEL sees the field.
        self.kubectl("apply", "-f", "-",
                     input=widget("good", 2, "a-edit", "    syncSeconds: 1.5\n"))

    def test_status_via_api_returns_422_causes(self):
        code, body = self.s.api("POST", "/apis/test.edit.io/v1alpha1/namespaces/default/"
                                "widgets", {"apiVersion": "test.edit.io/v1alpha1",
                                            "kind": "Widget", "metadata": {"name": "x"},
                                            "spec": {"replicas": 100}})
        self.assertEqual(code, 422)
        self.assertEqual(body["reason"], "Invalid")
        self.assertEqual(body["details"]["causes"][0]["field"], "spec.replicas")
        self.assertEqual(body["message"], 'Widget.test.edit.io "x" is invalid: spec.replicas: '
                         'Invalid value: 100: spec.replicas in body should be less than or '
                         'equal to 64')

    def test_apply_twice_patches_and_bumps_generation(self):
        self.kubectl("apply", "-f", "-", input=widget("twice", 2))
        out = self.kubectl("apply", "-f", "-", input=widget("twice", 4)).stdout
        self.assertIn("configured", out)
        obj = json.loads(self.kubectl("get", "wg", "twice", "-o", "json").stdout)
        self.assertEqual(obj["spec"]["replicas"], 4)
        self.assertEqual(obj["metadata"]["generation"], 2)
        out = self.kubectl("apply", "-f", "-", input=widget("twice", 4)).stdout
        self.assertIn("unchanged", out)

    def test_status_subresource_and_wait(self):
        self.kubectl("apply", "-f", "-", input=widget("st", 1))
        before = json.loads(self.kubectl("get", "wg", "st", "-o", "json").stdout)
        # The main resource ignores status.
        self.kubectl("patch", "wg", "st", "--type=merge", "-p",
                     '{"status":{"phase":"Ignored"}}')
        self.kubectl("patch", "wg", "st", "--subresource=status", "--type=merge", "-p",
                     '{"status":{"phase":"Running","conditions":[{"type":"Ready",'
                     '"status":"True"}]}}')
        self.kubectl("wait", "--for=condition=Ready", "--timeout=10s", "wg/st")
        after = json.loads(self.kubectl("get", "wg", "st", "-o", "json").stdout)
        self.assertEqual(after["status"]["phase"], "Running")
        self.assertEqual(after["metadata"]["generation"], before["metadata"]["generation"])
        self.assertIn("Running", self.kubectl("get", "wg", "st").stdout)

    def test_stale_update_conflicts(self):
        self.kubectl("apply", "-f", "-", input=widget("cas", 1))
        path = "/apis/test.edit.io/v1alpha1/namespaces/default/widgets/cas"
        _, obj = self.s.api("GET", path)
        obj["spec"]["replicas"] = 2
        code, fresh = self.s.api("PUT", path, obj)
        self.assertEqual(code, 200)
        obj["spec"]["replicas"] = 3
        code, body = self.s.api("PUT", path, obj)
        self.assertEqual((code, body["reason"]), (409, "Conflict"))
        self.assertIn("the object has been modified", body["message"])

    def test_json_patch(self):
        self.kubectl("apply", "-f", "-", input=widget("jp", 1))
        self.kubectl("patch", "wg", "jp", "--type=json", "-p",
                     '[{"op":"replace","path":"/spec/replicas","value":5}]')
        self.assertIn(" 5 ", self.kubectl("get", "wg", "jp").stdout)


EDITJOB_CRD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "crds", "editjob.yaml")
EJ = "/apis/edit.io/v1alpha1/namespaces/default/editjobs/"


def editjob(name, replicas=2, **spec):
    return json.dumps({"apiVersion": "edit.io/v1alpha1", "kind": "EDiTJob", "metadata": {"name": name},
                       "spec": dict(spec, replicas=replicas, image="unused.local/edit-runtime:test")})


class ScaleSubresourceTest(StandInCase):
    """The scale subresource with the project's CRD (crds/editjob.yaml) and real kubectl:
    kubectl scale PATCHes /scale (merge patch), or with --current-replicas GETs it and PUTs
    it back; either is an update of spec.replicas with the CRD's schema and rules."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        for crd, name in ((EDITJOB_CRD, "editjobs.edit.io"),
                          (os.path.join(FIXTURES, "widget-crd.yaml"), "widgets.test.edit.io")):
            cls.s.kubectl("apply", "-f", crd)
            cls.s.kubectl("wait", "--for=condition=Established", "--timeout=10s", "crd/" + name)

    def job(self, name):
        return json.loads(self.kubectl("get", "editjob", name, "-o", "json").stdout)

    def test_kubectl_scale_updates_spec_replicas(self):
        self.kubectl("apply", "-f", "-", input=editjob("sc", 2, shardsPerReplica=2))
        before = self.job("sc")
        rv = before["metadata"]["resourceVersion"]
        events = http.client.HTTPConnection(self.s.host, self.s.port, timeout=10)
        events.request("GET", "/apis/edit.io/v1alpha1/namespaces/default/editjobs"
                       "?watch=true&fieldSelector=metadata.name%3Dsc&resourceVersion=" + rv)
        watch = events.getresponse()

        self.assertIn("editjob.edit.io/sc scaled", self.kubectl("scale", "editjob/sc", "--replicas=3").stdout)
        self.assertEqual(self.kubectl("get", "editjob", "sc", "-o", "jsonpath={.spec.replicas}").stdout, "3")
        after = self.job("sc")
        self.assertEqual(after["metadata"]["generation"], before["metadata"]["generation"] + 1)
        ev = json.loads(watch.readline())
        events.close()
        self.assertEqual((ev["type"], ev["object"]["spec"]["replicas"]), ("MODIFIED", 3))

        # The Scale mirrors the object; status.replicas is 0 and the selector absent until set.
        sc = json.loads(self.kubectl("get", "--raw", EJ + "sc/scale").stdout)
        self.assertEqual((sc["apiVersion"], sc["kind"]), ("autoscaling/v1", "Scale"))
        for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp"):
            self.assertEqual(sc["metadata"][k], after["metadata"][k], k)
        self.assertEqual((sc["spec"], sc["status"]), ({"replicas": 3}, {"replicas": 0}))
        self.kubectl("patch", "editjob", "sc", "--subresource=status", "--type=merge", "-p",
                     '{"status":{"replicas":2,"selector":"edit.io/job-name=sc"}}')
        sc = json.loads(self.kubectl("get", "--raw", EJ + "sc/scale").stdout)
        self.assertEqual(sc["status"], {"replicas": 2, "selector": "edit.io/job-name=sc"})
        self.assertEqual(self.job("sc")["metadata"]["generation"], after["metadata"]["generation"])
        # -o wide: REPLICAS is status.replicas (training now), SHARDS the spec.
        wide = self.kubectl("get", "editjob", "sc", "-o", "wide").stdout.splitlines()
        head = wide[0].split()
        row = wide[1][wide[0].index("REPLICAS"):].split()
        self.assertEqual(row[:2], ["2", "2"], wide)
        self.assertEqual(head[head.index("REPLICAS") + 1], "SHARDS")

        # With --current-replicas kubectl GETs the Scale, checks it and PUTs it back.
        self.kubectl("scale", "editjob/sc", "--current-replicas=3", "--replicas=1")
        self.assertEqual(self.job("sc")["spec"]["replicas"], 1)
        # Server-side dry run: validated, not stored.
        out = self.kubectl("scale", "editjob/sc", "--replicas=4", "--dry-run=server").stdout
        self.assertIn("scaled (server dry run)", out)
        self.assertEqual(self.job("sc")["spec"]["replicas"], 1)

    def test_refusals_name_the_field(self):
        self.kubectl("apply", "-f", "-", input=editjob(
            "rf", 3, shardsPerReplica=2, debug={"corruptReplica": {"replica": 2}}))
        res = self.kubectl("scale", "editjob/rf", "--replicas=0", check=False)
        self.assertNotEqual(res.returncode, 0)
        self.assertIn('The EDiTJob "rf" is invalid', res.stderr)
        self.assertIn("spec.replicas: Invalid value: 0: spec.replicas in body should be greater than or equal to 1",
                      res.stderr)
        # kubectl refuses a negative count itself; the server names the field too.
        code, body = self.s.api("PATCH", EJ + "rf/scale", {"spec": {"replicas": -1}},
                                "application/merge-patch+json")
        self.assertEqual((code, body["details"]["causes"][0]["field"]), (422, "spec.replicas"))
        # The spec's CEL rules see the new count.
        res = self.kubectl("scale", "editjob/rf", "--replicas=2", check=False)
        self.assertIn("debug.corruptReplica.replica must be below replicas", res.stderr)
        res = self.kubectl("scale", "editjob/rf", "--replicas=3000", check=False)
        self.assertIn("the world size) must be at most 4096", res.stderr)
        # kubectl checks --current-replicas against the Scale before it writes.
        res = self.kubectl("scale", "editjob/rf", "--current-replicas=5", "--replicas=4", check=False)
        self.assertNotEqual(res.returncode, 0)
        self.assertIn("Expected replicas to be 5, was 3", res.stderr)
        # A stale resourceVersion in a Scale PUT is a conflict.
        _, sc = self.s.api("GET", EJ + "rf/scale")
        self.kubectl("scale", "editjob/rf", "--replicas=4")
        sc["spec"]["replicas"] = 5
        code, body = self.s.api("PUT", EJ + "rf/scale", sc)
        self.assertEqual((code, body["reason"]), (409, "Conflict"))
        # Every other field of the spec stays immutable.
        res = self.kubectl("patch", "editjob", "rf", "--type=merge", "-p", '{"spec":{"shardsPerReplica":4}}',
                           check=False)
        self.assertIn("spec.shardsPerReplica: Forbidden: spec.shardsPerReplica cannot change once the job exists",
                      res.stderr)
        job = self.job("rf")
        self.assertEqual((job["spec"]["replicas"], job["spec"]["shardsPerReplica"]), (4, 2))

    def test_no_scale_without_the_subresource(self):
        found = json.loads(self.kubectl("get", "--raw", "/apis/test.edit.io/v1alpha1").stdout)
        self.assertEqual([r["name"] for r in found["resources"]], ["widgets", "widgets/status"])
        found = json.loads(self.kubectl("get", "--raw", "/apis/edit.io/v1alpha1").stdout)
        sub = next(r for r in found["resources"] if r["name"] == "editjobs/scale")
        self.assertEqual((sub["group"], sub["version"], sub["kind"], sub["verbs"]),
                         ("autoscaling", "v1", "Scale", ["get", "patch", "update"]))
        self.kubectl("apply", "-f", "-", input=widget("noscale", 1))
        code, _ = self.s.api("GET", "/apis/test.edit.io/v1alpha1/namespaces/default/widgets/noscale/scale")
        self.assertEqual(code, 404)
        self.assertNotEqual(self.kubectl("scale", "widget/noscale", "--replicas=2", check=False).returncode, 0)


class CoreApiTest(StandInCase):
    def test_label_and_field_selectors(self):
        for name, tier in (("sel-a", "web"), ("sel-b", "db"), ("sel-c", "web")):
            self.kubectl("create", "-f", "-", input=json.dumps({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, "labels": {"tier": tier, "sel": "yes"}}}))
        names = lambda *a: self.kubectl("get", "cm", "-o", "name", *a).stdout.split()
        self.assertEqual(names("-l", "tier=web"), ["configmap/sel-a", "configmap/sel-c"])
        self.assertEqual(names("-l", "sel,tier!=web"), ["configmap/sel-b"])
        self.assertEqual(names("-l", "tier in (db,cache)"), ["configmap/sel-b"])
        self.assertEqual(names("-l", "sel,tier notin (db)"), ["configmap/sel-a",
                                                              "configmap/sel-c"])
        self.assertEqual(names("-l", "!nothere,tier=db"), ["configmap/sel-b"])
        self.assertEqual(names("--field-selector", "metadata.name=sel-c"), ["configmap/sel-c"])
        self.assertEqual(names("-l", "sel", "--field-selector", "metadata.name!=sel-c"),
                         ["configmap/sel-a", "configmap/sel-b"])
        self.kubectl("label", "cm", "sel-b", "tier=web", "--overwrite")
        self.assertEqual(len(names("-l", "tier=web")), 3)

    def test_owner_garbage_collection(self):
        code, owner = self.s.api("POST", "/api/v1/namespaces/default/configmaps",
                                 {"metadata": {"name": "gc-owner"}})
        self.assertEqual(code, 201)
        ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "gc-owner",
               "uid": owner["metadata"]["uid"], "blockOwnerDeletion": True}
        for i in range(3):
            code, _ = self.s.api("POST", "/api/v1/namespaces/default/configmaps", {
                "metadata": {"name": "gc-dep-%d" % i, "ownerReferences": [ref]}})
            self.assertEqual(code, 201)
        self.kubectl("delete", "cm", "gc-owner")
        self.s.wait_for(lambda: not self.kubectl("get", "cm", "-o", "name").stdout.count(
            "gc-dep"), what="dependents collected")

    def test_foreground_and_orphan(self):
        _, owner = self.s.api("POST", "/api/v1/namespaces/default/configmaps",
                              {"metadata": {"name": "fg-owner"}})
        ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "fg-owner",
               "uid": owner["metadata"]["uid"], "blockOwnerDeletion": True}
        self.s.api("POST", "/api/v1/namespaces/default/configmaps", {
            "metadata": {"name": "fg-dep", "ownerReferences": [ref],
                         "finalizers": ["test.edit.io/hold"]}})
        self.kubectl("delete", "cm", "fg-owner", "--cascade=foreground", "--wait=false")
        time.sleep(1.0)
        _, o = self.s.api("GET", "/api/v1/namespaces/default/configmaps/fg-owner")
        self.assertIn("foregroundDeletion", o["metadata"]["finalizers"])
        self.s.api("PATCH", "/api/v1/namespaces/default/configmaps/fg-dep",
                   {"metadata": {"finalizers": None}}, "application/merge-patch+json")
        self.s.wait_for(lambda: self.s.api("GET", "/api/v1/namespaces/default/configmaps/"
                                           "fg-owner")[0] == 404, what="owner released")
        # Orphan keeps the dependent and strips the reference.
        _, owner = self.s.api("POST", "/api/v1/namespaces/default/configmaps",
                              {"metadata": {"name": "or-owner"}})
        ref["uid"], ref["name"] = owner["metadata"]["uid"], "or-owner"
        self.s.api("POST", "/api/v1/namespaces/default/configmaps",
                   {"metadata": {"name": "or-dep", "ownerReferences": [ref]}})
        self.kubectl("delete", "cm", "or-owner", "--cascade=orphan")
        time.sleep(1.0)
        code, dep = self.s.api("GET", "/api/v1/namespaces/default/configmaps/or-dep")
        self.assertEqual(code, 200)
        self.assertNotIn("ownerReferences", dep["metadata"])

    def test_finalizers_block_deletion(self):
        self.kubectl("apply", "-f", "-", input=json.dumps({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "fin", "finalizers": ["test.edit.io/keep"]}}))
        self.kubectl("delete", "cm", "fin", "--wait=false")
        obj = json.loads(self.kubectl("get", "cm", "fin", "-o", "json").stdout)
        self.assertIn("deletionTimestamp", obj["metadata"])
        self.kubectl("patch", "cm", "fin", "--type=json", "-p",
                     '[{"op":"remove","path":"/metadata/finalizers"}]')
        res = self.kubectl("get", "cm", "fin", check=False)
        self.assertIn("NotFound", res.stderr)

    def test_errors_and_generate_name(self):
        code, body = self.s.api("GET", "/api/v1/namespaces/default/configmaps/nope")
        self.assertEqual((code, body["reason"], body["message"]),
                         (404, "NotFound", 'configmaps "nope" not found'))
        code, made = self.s.api("POST", "/api/v1/namespaces/default/configmaps",
                                {"metadata": {"generateName": "gen-"}})
        self.assertEqual(code, 201)
        self.assertTrue(made["metadata"]["name"].startswith("gen-"))
        code, body = self.s.api("POST", "/api/v1/namespaces/default/configmaps",
                                {"metadata": {"name": made["metadata"]["name"]}})
        self.assertEqual((code, body["reason"]), (409, "AlreadyExists"))
        code, body = self.s.api("POST", "/api/v1/namespaces/nowhere/configmaps",
                                {"metadata": {"name": "x"}})
        self.assertEqual((code, body["message"]), (404, 'namespaces "nowhere" not found'))

    def test_kubectl_create_generators_and_namespace_deletion(self):
        # kubectl sends these as protobuf.
        self.kubectl("create", "namespace", "team1")
        self.kubectl("create", "configmap", "c1", "-n", "team1", "--from-literal=a=b")
        self.kubectl("create", "secret", "generic", "s1", "-n", "team1", "--from-literal=pw=x")
        cm = json.loads(self.kubectl("get", "cm", "c1", "-n", "team1", "-o", "json").stdout)
        self.assertEqual(cm["data"], {"a": "b"})
        sec = json.loads(self.kubectl("get", "secret", "s1", "-n", "team1", "-o", "json").stdout)
        self.assertEqual((sec["data"], sec["type"]), ({"pw": "eA=="}, "Opaque"))
        self.kubectl("delete", "namespace", "team1", "--timeout=20s")
        self.assertIn("NotFound", self.kubectl("get", "cm", "c1", "-n", "team1",
                                               check=False).stderr)

    def test_describe_and_leases(self):
        self.kubectl("apply", "-f", "-", input=json.dumps({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "leader"},
            "spec": {"holderIdentity": "op-1", "leaseDurationSeconds": 15}}))
        out = self.kubectl("describe", "lease", "leader").stdout
        self.assertIn("op-1", out)
        self.assertIn("leader", self.kubectl("get", "leases").stdout)


if __name__ == "__main__":
    unittest.main()
