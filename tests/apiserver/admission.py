"""What the real server does to objects on write: name validation, custom
resource schemas, built-in defaults (pods, services, secrets, namespaces) and
CRD registration."""
import base64
import re
import threading

import errors
import podsecurity
import schema

# Per-request options (fieldValidation) that the store's admit hook needs.
request_ctx = threading.local()

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# Kinds whose names must be DNS labels rather than subdomains.
_LABEL_NAMED = ("/namespaces", "/services")


class Admission:
    def __init__(self, store, registry):
        self.store, self.registry = store, registry
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
