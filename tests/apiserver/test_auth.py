"""Who may do what: kubectl create token, RBAC decisions (and 403s worded like the real
server) for a ServiceAccount's token, the audit log, the owner-reference permission
check, Pod Security admission and the Eviction API."""
import json

from standin_fixture import StandInCase

RBAC = """
apiVersion: v1
kind: Namespace
metadata: {name: team}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: bot, namespace: team}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: pod-reader}
rules:
  - apiGroups: [""]
    resources: [pods]
    verbs: [get, list]
  - apiGroups: [""]
    resources: [pods/log]
    verbs: [get]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: read-pods, namespace: team}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: pod-reader}
subjects: [{kind: ServiceAccount, name: bot, namespace: team}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: configmaps, namespace: team}
rules:
  - apiGroups: [""]
    resources: [configmaps]
    verbs: [create, update]
  - apiGroups: [""]
    resources: [configmaps]
    verbs: [delete]
    resourceNames: [doomed]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: configmaps, namespace: team}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: configmaps}
subjects: [{kind: ServiceAccount, name: bot, namespace: team}]
"""


class AuthTest(StandInCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.s.kubectl("apply", "-f", "-", input=RBAC)
        cls.token = cls.s.kubectl("create", "token", "bot", "-n", "team").stdout.strip()

    def as_bot(self, method, path, body=None, ctype="application/json"):
        return self.s.api(method, path, body, ctype, headers={"Authorization": "Bearer " + self.token})

    def test_the_token_is_authorized_by_rbac(self):
        # (kubectl itself sends no token over plain HTTP, so the requests are made here.)
        code, body = self.as_bot("GET", "/api/v1/namespaces/team/pods")
        self.assertEqual(code, 200, body)
        code, body = self.as_bot("GET", "/api/v1/namespaces/default/pods")
        self.assertEqual(code, 403, body)
        self.assertEqual(body["message"], 'pods is forbidden: User "system:serviceaccount:team:bot" cannot list '
                         'resource "pods" in API group "" in the namespace "default"')

    def test_403_outside_the_rules(self):
        code, body = self.as_bot("GET", "/api/v1/pods")
        self.assertEqual(code, 403, body)
        self.assertEqual(body["reason"], "Forbidden")
        self.assertIn('cannot list resource "pods" in API group "" at the cluster scope', body["message"])
        code, body = self.as_bot("POST", "/api/v1/namespaces/team/pods", {"metadata": {"name": "x"}})
        self.assertEqual(code, 403, body)
        self.assertIn('cannot create resource "pods"', body["message"])
        code, body = self.as_bot("PUT", "/api/v1/namespaces/team/pods/x/status", {"metadata": {"name": "x"}})
        self.assertEqual(code, 403)
        self.assertIn('"pods/status"', body["message"])
        # resourceNames: delete only the named ConfigMap.
        for name in ("doomed", "kept"):
            code, _ = self.as_bot("POST", "/api/v1/namespaces/team/configmaps", {"metadata": {"name": name}})
            self.assertEqual(code, 201)
        self.assertEqual(self.as_bot("DELETE", "/api/v1/namespaces/team/configmaps/kept")[0], 403)
        self.assertEqual(self.as_bot("DELETE", "/api/v1/namespaces/team/configmaps/doomed")[0], 200)

    def test_bad_tokens_are_401(self):
        for header in ("Bearer nonsense", "Bearer standin-sa.e30", "Basic abc"):
            code, body = self.s.api("GET", "/api/v1/namespaces/team/pods", headers={"Authorization": header})
            self.assertEqual(code, 401, header)
            self.assertEqual(body["reason"], "Unauthorized")

    def test_audit_names_the_rules_used(self):
        self.as_bot("GET", "/api/v1/namespaces/team/pods")
        self.as_bot("GET", "/api/v1/namespaces/kube-system/pods")
        code, log = self.s.api("GET", "/standin/audit")
        self.assertEqual(code, 200)
        mine = [e for e in log if e["user"] == "system:serviceaccount:team:bot" and e["resource"] == "pods"
                and e["verb"] == "list"]
        allowed = [e for e in mine if e["namespace"] == "team"]
        denied = [e for e in mine if e["namespace"] == "kube-system"]
        self.assertTrue(allowed and allowed[-1]["allowed"], mine)
        self.assertEqual(allowed[-1]["rules"], [{"kind": "ClusterRole", "namespace": "", "name": "pod-reader",
                                                 "index": 0}])
        self.assertTrue(denied and not denied[-1]["allowed"] and denied[-1]["rules"] == [], mine)

    def test_changing_owner_references_needs_delete_and_finalizers(self):
        owner = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": "u-1"}
        # Creating with an owner reference is allowed (the creator could as well not have).
        code, body = self.as_bot("POST", "/api/v1/namespaces/team/configmaps",
                                 {"metadata": {"name": "child", "ownerReferences": [owner]}})
        self.assertEqual(code, 201, body)
        # Changing it later needs delete on the object.
        code, body = self.as_bot("PUT", "/api/v1/namespaces/team/configmaps/child",
                                 {"metadata": {"name": "child", "ownerReferences": []}})
        self.assertEqual(code, 403, body)
        self.assertIn("cannot set an ownerRef on a resource you can't delete", body["message"])
        # blockOwnerDeletion needs update on the owner's finalizers.
        code, body = self.as_bot("POST", "/api/v1/namespaces/team/configmaps",
                                 {"metadata": {"name": "blocker", "ownerReferences": [dict(owner, blockOwnerDeletion=True)]}})
        self.assertEqual(code, 403, body)
        self.assertIn('cannot set blockOwnerDeletion if an ownerReference refers to a resource you can\'t set '
                      'finalizers on', body["message"])
        self.assertIn('"configmaps/finalizers"', body["message"])


class PodSecurityAndEvictionTest(StandInCase):
    extra_args = ("--kubelet",)

    def test_restricted_namespace_rejects_a_pod_that_violates_it(self):
        self.kubectl("create", "namespace", "locked")
        self.kubectl("label", "namespace", "locked", "pod-security.kubernetes.io/enforce=restricted")
        bad = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bad", "namespace": "locked"},
               "spec": {"containers": [{"name": "main", "image": "x", "command": ["true"]}]}}
        res = self.kubectl("apply", "-f", "-", input=json.dumps(bad), check=False)
        self.assertNotEqual(res.returncode, 0)
        self.assertIn('violates PodSecurity "restricted:latest": allowPrivilegeEscalation != false '
                      '(container "main" must set securityContext.allowPrivilegeEscalation=false)', res.stderr)
        good = json.loads(json.dumps(bad))
        good["metadata"]["name"] = "good"
        good["spec"]["securityContext"] = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
        good["spec"]["containers"][0]["securityContext"] = {"allowPrivilegeEscalation": False,
                                                            "capabilities": {"drop": ["ALL"]}}
        self.kubectl("apply", "-f", "-", input=json.dumps(good))

    def test_eviction_marks_the_pod_and_deletes_it(self):
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "victim"},
               "spec": {"terminationGracePeriodSeconds": 5,
                        "containers": [{"name": "main", "image": "x", "command": ["sh", "-c", "sleep 60"]}]}}
        self.kubectl("apply", "-f", "-", input=json.dumps(pod))
        self.s.wait_for(lambda: self.s.api("GET", "/api/v1/namespaces/default/pods/victim")[1]
                        .get("status", {}).get("phase") == "Running", what="victim running")
        code, body = self.s.api("POST", "/api/v1/namespaces/default/pods/victim/eviction",
                                {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "victim"}})
        self.assertEqual(code, 201, body)
        code, obj = self.s.api("GET", "/api/v1/namespaces/default/pods/victim")
        if code == 200:         # still terminating
            conds = {c["type"]: c for c in obj["status"]["conditions"]}
            self.assertEqual(conds["DisruptionTarget"]["reason"], "EvictionByEvictionAPI")
            self.assertTrue(obj["metadata"].get("deletionTimestamp"))
        self.s.wait_for(lambda: self.s.api("GET", "/api/v1/namespaces/default/pods/victim")[0] == 404,
                        what="victim gone")
