"""Known resource types: the built-in ones and those that CRDs register.

Also renders the discovery documents (/api, /apis, APIResourceLists).
"""
import re
import threading

ALL_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


class ResourceType:
    def __init__(self, group, version, plural, kind, namespaced=True, short_names=(),
                 categories=(), has_status=False, singular=None, schema=None,
                 printer_columns=None, versions=None, crd_name=None, subresources=(),
                 scale=None):
        self.group, self.version, self.plural, self.kind = group, version, plural, kind
        self.namespaced = namespaced
        self.short_names = list(short_names)
        self.categories = list(categories)
        self.has_status = has_status
        self.singular = singular or kind.lower()
        self.schema = schema                 # openAPIV3Schema for custom resources
        self.printer_columns = printer_columns
        self.crd_name = crd_name             # set for custom resources
        self.subresources = list(subresources)
        self.scale = scale                   # a CRD's subresources.scale (its paths)
        # All versions share one storage key, so objects survive version changes
        # (no conversion: only apiVersion is rewritten).
        self.key = "%s/%s" % (group, plural)

    @property
    def api_version(self):
        return "%s/%s" % (self.group, self.version) if self.group else self.version

    @property
    def gv_path(self):
        return "apis/%s/%s" % (self.group, self.version) if self.group else "api/v1"

    def __repr__(self):
        return "<ResourceType %s %s>" % (self.api_version, self.plural)


def _builtin():
    R = ResourceType
    return [
        R("", "v1", "namespaces", "Namespace", namespaced=False, short_names=["ns"],
          has_status=True, subresources=["status", "finalize"]),
        R("", "v1", "pods", "Pod", short_names=["po"], categories=["all"], has_status=True,
          subresources=["status", "log", "eviction"]),
        R("", "v1", "services", "Service", short_names=["svc"], categories=["all"],
          has_status=True, subresources=["status"]),
        R("", "v1", "configmaps", "ConfigMap", short_names=["cm"]),
        R("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", short_names=["pvc"],
          has_status=True, subresources=["status"]),
        R("", "v1", "secrets", "Secret"),
        R("", "v1", "resourcequotas", "ResourceQuota", short_names=["quota"], has_status=True,
          subresources=["status"]),
        R("", "v1", "serviceaccounts", "ServiceAccount", short_names=["sa"],
          subresources=["token"]),
        R("", "v1", "endpoints", "Endpoints", short_names=["ep"]),
        R("", "v1", "events", "Event", short_names=["ev"]),
        R("", "v1", "nodes", "Node", namespaced=False, short_names=["no"], has_status=True,
          subresources=["status"]),
        R("events.k8s.io", "v1", "events", "Event", short_names=["ev"]),
        R("coordination.k8s.io", "v1", "leases", "Lease"),
        R("batch", "v1", "jobs", "Job", categories=["all"], has_status=True, subresources=["status"]),
        R("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", short_names=["netpol"]),
        R("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", namespaced=False),
        R("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding",
          namespaced=False),
        R("rbac.authorization.k8s.io", "v1", "roles", "Role"),
        R("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding"),
        R("apiextensions.k8s.io", "v1", "customresourcedefinitions",
          "CustomResourceDefinition", namespaced=False, short_names=["crd", "crds"],
          categories=["api-extensions"], has_status=True, subresources=["status"]),
    ]


class Registry:
    def __init__(self):
        self.lock = threading.RLock()
        self.by_gvr = {}          # (group, version, plural) -> ResourceType
        self.crd_types = {}       # crd name -> [ResourceType]
        for rt in _builtin():
            self.by_gvr[(rt.group, rt.version, rt.plural)] = rt

    def lookup(self, group, version, plural):
        with self.lock:
            return self.by_gvr.get((group, version, plural))

    def types(self):
        with self.lock:
            return list(self.by_gvr.values())

    def by_key(self, key):
        """Any version's ResourceType for a storage key (group/plural)."""
        with self.lock:
            for rt in self.by_gvr.values():
                if rt.key == key:
                    return rt
        return None

    def by_kind(self, api_version, kind):
        with self.lock:
            for rt in self.by_gvr.values():
                if rt.api_version == api_version and rt.kind == kind:
                    return rt
        return None

    def register_crd(self, crd):
        """(Re)register the served versions of a CRD; returns the types."""
        spec = crd.get("spec") or {}
        names = spec.get("names") or {}
        group, name = spec.get("group"), crd["metadata"]["name"]
        types = []
        for ver in spec.get("versions") or []:
            if not ver.get("served", True):
                continue
            sub = ver.get("subresources") or {}
            types.append(ResourceType(
                group, ver["name"], names.get("plural"), names.get("kind"),
                namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                short_names=names.get("shortNames") or [],
                categories=names.get("categories") or [],
                has_status="status" in sub, singular=names.get("singular"),
                schema=(ver.get("schema") or {}).get("openAPIV3Schema") or {},
                printer_columns=ver.get("additionalPrinterColumns") or [],
                crd_name=name, subresources=[s for s in ("status", "scale") if s in sub],
                scale=sub.get("scale")))
        with self.lock:
            self.unregister_crd(name)
            for rt in types:
                self.by_gvr[(rt.group, rt.version, rt.plural)] = rt
            self.crd_types[name] = types
        return types

    def unregister_crd(self, name):
        with self.lock:
            for rt in self.crd_types.pop(name, []):
                self.by_gvr.pop((rt.group, rt.version, rt.plural), None)

    # ---- discovery documents -------------------------------------------
    def group_versions(self):
        """{group: [versions]} for non-core groups, in a stable order."""
        out = {}
        for rt in self.types():
            if rt.group:
                vs = out.setdefault(rt.group, [])
                if rt.version not in vs:
                    vs.append(rt.version)
        for vs in out.values():
            vs.sort(key=_version_priority)
        return dict(sorted(out.items()))

    def api_versions(self):
        return {"kind": "APIVersions", "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0",
                                                "serverAddress": "127.0.0.1"}]}

    def api_group_list(self):
        groups = []
        for group, versions in self.group_versions().items():
            gvs = [{"groupVersion": "%s/%s" % (group, v), "version": v} for v in versions]
            groups.append({"name": group, "versions": gvs, "preferredVersion": gvs[0]})
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}

    def api_group(self, group):
        versions = self.group_versions().get(group)
        if not versions:
            return None
        gvs = [{"groupVersion": "%s/%s" % (group, v), "version": v} for v in versions]
        return {"kind": "APIGroup", "apiVersion": "v1", "name": group, "versions": gvs,
                "preferredVersion": gvs[0]}

    def resource_list(self, group, version):
        rts = [rt for rt in self.types() if rt.group == group and rt.version == version]
        if not rts:
            return None
        resources = []
        for rt in sorted(rts, key=lambda r: r.plural):
            entry = {"name": rt.plural, "singularName": rt.singular,
                     "namespaced": rt.namespaced, "kind": rt.kind, "verbs": ALL_VERBS}
            if rt.short_names:
                entry["shortNames"] = rt.short_names
            if rt.categories:
                entry["categories"] = rt.categories
            resources.append(entry)
            for sub in rt.subresources:
                verbs, kind = {"log": (["get"], "Pod"), "eviction": (["create"], "Eviction"),
                               "token": (["create"], "TokenRequest"),
                               "scale": (["get", "patch", "update"], "Scale")}.get(
                                   sub, (["get", "patch", "update"], rt.kind))
                entry = {"name": "%s/%s" % (rt.plural, sub), "singularName": "",
                         "namespaced": rt.namespaced, "verbs": verbs, "kind": kind}
                if sub == "eviction":
                    entry.update(group="policy", version="v1")
                if sub == "token":
                    entry.update(group="authentication.k8s.io", version="v1")
                if sub == "scale":
                    entry.update(group="autoscaling", version="v1")
                resources.append(entry)
        return {"kind": "APIResourceList", "apiVersion": "v1",
                "groupVersion": "%s/%s" % (group, version) if group else version,
                "resources": resources}


def _version_priority(v):
    """Kubernetes version ordering: GA > beta > alpha, higher numbers first."""
    m = re.match(r"^v(\d+)(?:(alpha|beta)(\d+))?$", v)
    if not m:
        return (3, 0, 0, v)
    rank = {None: 0, "beta": 1, "alpha": 2}[m.group(2)]
    return (rank, -int(m.group(1)), -int(m.group(3) or 0), v)
