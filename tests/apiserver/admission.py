"""What the real server does to objects on write: name validation, custom
resource schemas, built-in defaults (pods, services, secrets, namespaces) and
CRD registration."""
import base64
import re
import threading

import errors
import podsecurity
import quantity
import schema

# Per-request options (fieldValidation) that the store's admit hook needs.
request_ctx = threading.local()

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_GATE = "kueue.x-k8s.io/admission"
# Kinds whose names must be DNS labels rather than subdomains.
_LABEL_NAMED = ("/namespaces", "/services")


class Admission:
    def __init__(self, store, registry, storage_classes=("standard",), kueue_gate=False):
        self.store, self.registry = store, registry
        self.storage_classes = list(storage_classes)  # claims of these (or none) bind at once
        self.kueue_gate = kueue_gate
        self.auth = None          # auth.Auth: the owner-reference permission check
        self._svc_ip = 10
        store.admit = self.admit
        store.listeners.append(self._on_event)

    # ---- the store hook --------------------------------------------------
    def admit(self, op, rt, obj, old, subresource):
        name = obj["metadata"].get("name", "")
        if op == "create":
            self._check_name(rt, name)
        user = getattr(request_ctx, "user", None)   # None: the stand-in itself (kubelet, GC)
        if user is not None and self.auth is not None and subresource != "status":
            self.auth.check_owner_references(user, rt, op, obj, old)
        if rt.crd_name:
            obj = self._custom(rt, obj, old)
        fn = getattr(self, "_" + rt.key.strip("/").replace(".", "_").replace("/", "_"), None)
        if fn is not None:
            obj = fn(op, rt, obj, old)
        return obj

    def _check_name(self, rt, name):
        pattern = _DNS_LABEL if rt.key in _LABEL_NAMED else _DNS_SUBDOMAIN
        limit = 63 if rt.key in _LABEL_NAMED else 253
        if not pattern.match(name) or len(name) > limit:
            what = "RFC 1123 label" if rt.key in _LABEL_NAMED else "RFC 1123 subdomain"
            raise errors.invalid(rt, name, [(
                "metadata.name", "FieldValueInvalid",
                'Invalid value: "%s": a lowercase %s must consist of lower case alphanumeric '
                "characters, '-' or '.', and must start and end with an alphanumeric "
                "character" % (name, what))])

    def _custom(self, rt, obj, old):
        strict = getattr(request_ctx, "field_validation", "") == "Strict"
        obj, unknown, errs = schema.process(rt.schema or {}, obj, old, strict)
        name = obj["metadata"].get("name", "")
        if unknown:
            raise errors.bad_request(
                '%s in version "%s" cannot be handled as a %s: strict decoding error: %s'
                % (rt.kind, rt.version, rt.kind,
                   ", ".join('unknown field "%s"' % u for u in unknown)))
        if errs:
            raise errors.invalid(rt, name, errs)
        return obj

    # ---- built-in kinds (method names follow the storage key) ---------------
    def _secrets(self, op, rt, obj, old):
        data = obj.setdefault("data", {})
        for k, v in (obj.pop("stringData", None) or {}).items():
            data[k] = base64.b64encode(v.encode()).decode()
        obj["type"] = obj.get("type") or "Opaque"
        return obj

    def _services(self, op, rt, obj, old):
        spec = obj.setdefault("spec", {})
        spec.setdefault("type", "ClusterIP")
        spec.setdefault("sessionAffinity", "None")
        if old is not None:
            spec.setdefault("clusterIP", (old.get("spec") or {}).get("clusterIP"))
        if not spec.get("clusterIP"):
            # With the kubelet, a loopback address its service proxy serves; without, never routed.
            ip = self.store.allocate_cluster_ip() if self.store.allocate_cluster_ip else None
            if not ip:
                self._svc_ip += 1
                ip = "10.96.%d.%d" % (self._svc_ip // 250, self._svc_ip % 250 + 1)
            spec["clusterIP"] = ip
        spec.setdefault("clusterIPs", [spec["clusterIP"]])
        for p in spec.get("ports") or []:
            p.setdefault("protocol", "TCP")
            p.setdefault("targetPort", p.get("port"))
        return obj

    def _pods(self, op, rt, obj, old):
        spec = obj.setdefault("spec", {})
        containers = spec.get("containers")
        causes = []
        if not containers:
            causes.append(("spec.containers", "FieldValueRequired", "Required value"))
        for i, c in enumerate(containers or []):
            if not c.get("name"):
                causes.append(("spec.containers[%d].name" % i, "FieldValueRequired",
                               "Required value"))
            c.setdefault("imagePullPolicy", "IfNotPresent")
            c.setdefault("terminationMessagePath", "/dev/termination-log")
        if causes:
            raise errors.invalid(rt, obj["metadata"].get("name", ""), causes)
        if op == "create":
            self._pod_security(obj)
            self._quota(obj)
            if self.kueue_gate and KUEUE_QUEUE_LABEL in (obj["metadata"].get("labels") or {}):
                gates = spec.setdefault("schedulingGates", [])
                if not any(g.get("name") == KUEUE_GATE for g in gates):
                    gates.append({"name": KUEUE_GATE})
        spec.setdefault("restartPolicy", "Always")
        spec.setdefault("terminationGracePeriodSeconds", 30)
        spec.setdefault("dnsPolicy", "ClusterFirst")
        spec.setdefault("schedulerName", "default-scheduler")
        spec.setdefault("enableServiceLinks", True)
        if op == "create":
            obj["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
        return obj

    def _pod_security(self, pod):
        """Pod Security admission: the level a namespace enforces (label
        pod-security.kubernetes.io/enforce) rejects a pod that violates it."""
        ns = self.store.find(self.registry.lookup("", "v1", "namespaces"), "",
                             pod["metadata"].get("namespace", ""))
        level = ((ns or {}).get("metadata", {}).get("labels") or {}).get(
            "pod-security.kubernetes.io/enforce", "privileged")
        problems = podsecurity.violations(pod, level)
        if problems:
            raise errors.ApiError(403, "Forbidden", 'pods "%s" is forbidden: violates PodSecurity "%s:latest": %s'
                                  % (pod["metadata"].get("name", ""), level, ", ".join(problems)),
                                  {"name": pod["metadata"].get("name", ""), "kind": "pods"})

    def _quota(self, pod):
        """ResourceQuota admission: a pod that would take the namespace over a quota's
        spec.hard (pods, count/pods, cpu, memory and requests.* of them, extended
        resources as requests.NAME) is refused with 403, worded as the real server."""
        ns = pod["metadata"].get("namespace", "")
        quotas = self.store.list(self.registry.lookup("", "v1", "resourcequotas"), ns)[0]
        if not quotas:
            return
        want = quantity.pod_requests(pod)
        used = {}
        for p in self.store.list(self.registry.lookup("", "v1", "pods"), ns)[0]:
            if (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue
            for k, v in quantity.pod_requests(p).items():
                used[k] = used.get(k, 0.0) + v
        for q in quotas:
            hard = (q.get("spec") or {}).get("hard") or {}
            over = []
            for key, limit in sorted(hard.items()):
                res = {"count/pods": "pods"}.get(key, key[len("requests."):] if key.startswith("requests.") else key)
                try:
                    lim = quantity.parse(limit)
                except ValueError:
                    continue
                if want.get(res, 0) > 0 and used.get(res, 0) + want[res] > lim:
                    over.append((key, res, lim))
            if over:
                fmt = lambda vals: ",".join("%s=%s" % (k, quantity.show(r, v)) for k, r, v in vals)
                raise errors.ApiError(403, "Forbidden", 'pods "%s" is forbidden: exceeded quota: %s, requested: %s, '
                                      "used: %s, limited: %s" % (
                                          pod["metadata"].get("name", ""), q["metadata"]["name"],
                                          fmt([(k, r, want[r]) for k, r, _ in over]),
                                          fmt([(k, r, used.get(r, 0.0)) for k, r, _ in over]),
                                          fmt(over)),
                                      {"name": pod["metadata"].get("name", ""), "kind": "pods"})

    def _persistentvolumeclaims(self, op, rt, obj, old):
        """A stand-in provisioner: a claim of a known storage class (--storage-class) or of
        none (the default class) is Bound at once; any other stays Pending, as a claim of a
        class that does not exist does."""
        if op != "create":
            return obj
        spec = obj.setdefault("spec", {})
        cls = spec.get("storageClassName")
        if cls is None and self.storage_classes:
            cls = spec["storageClassName"] = self.storage_classes[0]
        if cls in self.storage_classes:
            spec["volumeName"] = "pvc-" + obj["metadata"]["uid"]
            obj["status"] = {"phase": "Bound", "accessModes": spec.get("accessModes") or [],
                             "capacity": ((spec.get("resources") or {}).get("requests") or {})}
        else:
            obj["status"] = {"phase": "Pending"}
        return obj

    def _namespaces(self, op, rt, obj, old):
        obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
        if op == "create":
            obj["status"] = {"phase": "Active"}
        labels = obj["metadata"].setdefault("labels", {})
        labels["kubernetes.io/metadata.name"] = obj["metadata"]["name"]
        return obj

    def _apiextensions_k8s_io_customresourcedefinitions(self, op, rt, obj, old):
        spec = obj.get("spec") or {}
        names = spec.get("names") or {}
        name = obj["metadata"].get("name", "")
        causes = []
        for field, val in (("spec.group", spec.get("group")),
                           ("spec.names.plural", names.get("plural")),
                           ("spec.names.kind", names.get("kind"))):
            if not val:
                causes.append((field, "FieldValueRequired", "Required value"))
        if not spec.get("versions"):
            causes.append(("spec.versions", "FieldValueRequired", "Required value"))
        if not causes and name != "%s.%s" % (names["plural"], spec["group"]):
            causes.append(("metadata.name", "FieldValueInvalid",
                           'Invalid value: "%s": must be spec.names.plural+"."+spec.group'
                           % name))
        if causes:
            raise errors.invalid(rt, name, causes)
        names.setdefault("singular", names["kind"].lower())
        names.setdefault("listKind", names["kind"] + "List")
        spec.setdefault("scope", "Namespaced")
        stored = [v["name"] for v in spec["versions"] if v.get("storage")]
        obj["status"] = {
            "acceptedNames": dict(names),
            "storedVersions": stored or [spec["versions"][0]["name"]],
            "conditions": [_cond("NamesAccepted", "NoConflicts", "no conflicts found"),
                           _cond("Established", "InitialNamesAccepted",
                                 "the initial names have been accepted")]}
        if old is not None and old.get("status"):
            # Keep transition times stable across updates.
            obj["status"]["conditions"] = old["status"].get("conditions",
                                                            obj["status"]["conditions"])
        return obj

    # ---- CRDs register resource types ------------------------------------------
    def _on_event(self, rt, etype, obj):
        if rt is None or rt.key != "apiextensions.k8s.io/customresourcedefinitions":
            return
        name = obj["metadata"]["name"]
        if etype == "DELETED":
            types = self.registry.crd_types.get(name) or []
            if types:
                self.store.drop_type(types[0])
            self.registry.unregister_crd(name)
        else:
            self.registry.register_crd(obj)


def _cond(ctype, reason, message):
    from store import now_iso
    return {"type": ctype, "status": "True", "reason": reason, "message": message,
            "lastTransitionTime": now_iso()}
