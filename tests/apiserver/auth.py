"""Who may do what: service-account tokens (TokenRequest), RBAC authorization and the
OwnerReferencesPermissionEnforcement admission check, as a cluster applies them to a
controller's service account.

Requests without a token are the cluster admin (the kubeconfig the stand-in writes has
no credentials). A token from POST .../serviceaccounts/NAME/token (`kubectl create
token`) is that ServiceAccount: it is authorized by the stored ClusterRoles, Roles and
their bindings, and anything outside them is 403 Forbidden, worded like the real
server. Every decision on a token's request is kept in an audit log
(GET /standin/audit) naming the rules that allowed it, so that a test can tell which
rules a program used. Tokens are not signed (a test double): one names its
ServiceAccount and is valid while that ServiceAccount exists with the same uid.
"""
import base64
import json
import threading
import time

import errors

RBAC_GROUP = "rbac.authorization.k8s.io"
AUDIT_LIMIT = 100000


class User:
    def __init__(self, name, groups, sa=None):
        self.name, self.groups, self.sa = name, groups, sa   # sa: (namespace, name)

    @property
    def admin(self):
        return self.sa is None


ADMIN = User("system:admin", ["system:masters", "system:authenticated"])


class Attributes:
    """What a request does: verb on group/resource[/subresource] in namespace, name."""

    def __init__(self, verb, group, resource, subresource="", namespace="", name="", via=""):
        self.verb, self.group, self.resource = verb, group, resource
        self.subresource, self.namespace, self.name = subresource or "", namespace or "", name or ""
        self.via = via   # "" for the request itself, else the admission check that asked

    def full_resource(self):
        return self.resource + ("/" + self.subresource if self.subresource else "")

    def to_json(self):
        return {"verb": self.verb, "group": self.group, "resource": self.full_resource(),
                "namespace": self.namespace, "name": self.name, "via": self.via}


def forbidden(user, attrs, prefix_reason=""):
    """403 worded as the RBAC authorizer words it."""
    what = attrs.resource + ("." + attrs.group if attrs.group else "")
    obj = '%s "%s"' % (what, attrs.name) if attrs.name else what
    scope = ('in the namespace "%s"' % attrs.namespace) if attrs.namespace else "at the cluster scope"
    reason = 'User "%s" cannot %s resource "%s" in API group "%s" %s' % (
        user.name, attrs.verb, attrs.full_resource(), attrs.group, scope)
    details = {"kind": attrs.resource}
    if attrs.group:
        details["group"] = attrs.group
    if attrs.name:
        details["name"] = attrs.name
    return errors.ApiError(403, "Forbidden", "%s is forbidden: %s%s" % (obj, prefix_reason, reason), details)


class Auth:
    def __init__(self, store, registry):
        self.store, self.registry = store, registry
        self.lock = threading.Lock()
        self.audit = []

    # ---- authentication ------------------------------------------------------------
    def issue_token(self, namespace, name):
        sa = self.store.get(self.registry.lookup("", "v1", "serviceaccounts"), namespace, name)
        claims = {"ns": namespace, "sa": name, "uid": sa["metadata"]["uid"], "iat": int(time.time())}
        return "standin-sa." + base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=")

    def authenticate(self, header):
        """The user of an Authorization header; 401 for a token that names no live ServiceAccount."""
        if not header:
            return ADMIN
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.startswith("standin-sa."):
            raise _unauthorized()
        try:
            raw = token[len("standin-sa."):]
            claims = json.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
            ns, name, uid = claims["ns"], claims["sa"], claims["uid"]
        except (ValueError, KeyError, TypeError):
            raise _unauthorized()
        sa = self.store.find(self.registry.lookup("", "v1", "serviceaccounts"), ns, name)
        if sa is None or sa["metadata"]["uid"] != uid:
            raise _unauthorized()
        return User("system:serviceaccount:%s:%s" % (ns, name),
                    ["system:serviceaccounts", "system:serviceaccounts:%s" % ns, "system:authenticated"],
                    (ns, name))

    # ---- authorization -----------------------------------------------------------------
    def _objects(self, plural):
        return self.store.list(self.registry.lookup(RBAC_GROUP, "v1", plural))[0]

    def _bound(self, user, binding):
        for s in binding.get("subjects") or []:
            kind = s.get("kind")
            if kind == "ServiceAccount" and user.sa == (s.get("namespace") or
                                                        binding["metadata"].get("namespace", ""),
                                                        s.get("name")):
                return True
            if kind == "Group" and s.get("name") in user.groups:
                return True
            if kind == "User" and s.get("name") == user.name:
                return True
        return False

    def matching_rules(self, user, attrs):
        """[(role kind, role namespace, role name, rule index)] of every rule granting attrs."""
        out = []
        cluster_roles = {r["metadata"]["name"]: r for r in self._objects("clusterroles")}
        roles = {(r["metadata"]["namespace"], r["metadata"]["name"]): r for r in self._objects("roles")}
        grants = []   # (role object, kind, namespace of the role, namespace scope or None = all)
        for b in self._objects("clusterrolebindings"):
            ref = b.get("roleRef") or {}
            if ref.get("kind") == "ClusterRole" and ref.get("name") in cluster_roles and self._bound(user, b):
                grants.append((cluster_roles[ref["name"]], "ClusterRole", "", None))
        for b in self._objects("rolebindings"):
            ns = b["metadata"]["namespace"]
            if not self._bound(user, b):
                continue
            ref = b.get("roleRef") or {}
            if ref.get("kind") == "ClusterRole" and ref.get("name") in cluster_roles:
                grants.append((cluster_roles[ref["name"]], "ClusterRole", "", ns))
            elif ref.get("kind") == "Role" and (ns, ref.get("name")) in roles:
                grants.append((roles[(ns, ref["name"])], "Role", ns, ns))
        for role, kind, role_ns, scope in grants:
            if scope is not None and attrs.namespace != scope:
                continue            # a RoleBinding grants only inside its namespace
            for i, rule in enumerate(role.get("rules") or []):
                if _rule_allows(rule, attrs):
                    key = (kind, role_ns, role["metadata"]["name"], i)
                    if key not in out:
                        out.append(key)
        return out

    def authorize(self, user, attrs):
        """Raises 403 unless allowed; records the decision of a non-admin user."""
        if user.admin:
            return
        rules = self.matching_rules(user, attrs)
        entry = dict(attrs.to_json(), user=user.name, allowed=bool(rules), time=time.time(),
                     rules=[{"kind": k, "namespace": ns, "name": n, "index": i} for k, ns, n, i in rules])
        with self.lock:
            self.audit.append(entry)
            del self.audit[:-AUDIT_LIMIT]
        if not rules:
            raise forbidden(user, attrs)

    def audit_log(self):
        with self.lock:
            return list(self.audit)

    # ---- OwnerReferencesPermissionEnforcement -------------------------------------------
    def check_owner_references(self, user, rt, op, new, old):
        """Changing an object's ownerReferences needs delete on the object (not on create:
        whoever creates it could as well not have); a new blockOwnerDeletion needs update
        on the owner's finalizers subresource."""
        if user.admin:
            return
        md = new.get("metadata") or {}
        refs = md.get("ownerReferences") or []
        old_refs = ((old or {}).get("metadata") or {}).get("ownerReferences") or []
        if op == "create" and not refs or op != "create" and refs == old_refs:
            return
        ns, name = md.get("namespace", ""), md.get("name", "")
        via = "OwnerReferencesPermissionEnforcement"
        if op != "create":
            attrs = Attributes("delete", rt.group, rt.plural, "", ns, name, via)
            try:
                self.authorize(user, attrs)
            except errors.ApiError as e:
                raise errors.ApiError(403, "Forbidden", '%s "%s" is forbidden: cannot set an ownerRef on a '
                                      "resource you can't delete: %s" % (rt.plural, name, e.message))
        old_blocking = {r.get("uid") for r in old_refs if r.get("blockOwnerDeletion")}
        for r in refs:
            if not r.get("blockOwnerDeletion") or r.get("uid") in old_blocking:
                continue
            owner = self.registry.by_kind(r.get("apiVersion", ""), r.get("kind", ""))
            if owner is None:
                raise errors.ApiError(403, "Forbidden", '%s "%s" is forbidden: cannot set blockOwnerDeletion in '
                                      "this case because cannot find RESTMapping for APIVersion %s Kind %s"
                                      % (rt.plural, name, r.get("apiVersion"), r.get("kind")))
            attrs = Attributes("update", owner.group, owner.plural, "finalizers",
                               ns if owner.namespaced else "", r.get("name", ""), via)
            try:
                self.authorize(user, attrs)
            except errors.ApiError as e:
                raise errors.ApiError(403, "Forbidden", '%s "%s" is forbidden: cannot set blockOwnerDeletion if '
                                      "an ownerReference refers to a resource you can't set finalizers on: %s"
                                      % (rt.plural, name, e.message))


def _rule_allows(rule, a):
    if rule.get("nonResourceURLs"):
        return False
    verbs, groups, resources = rule.get("verbs") or [], rule.get("apiGroups") or [], rule.get("resources") or []
    if "*" not in verbs and a.verb not in verbs:
        return False
    if "*" not in groups and a.group not in groups:
        return False
    full = a.full_resource()
    if not ("*" in resources or full in resources or
            (a.subresource and "*/" + a.subresource in resources)):
        return False
    names = rule.get("resourceNames") or []
    return not names or (a.name in names and a.verb not in ("create", "list", "watch", "deletecollection"))


def _unauthorized():
    return errors.ApiError(401, "Unauthorized", "Unauthorized")
