"""Object storage: one global resourceVersion counter, a bounded watch history,
live watchers, finalizer-aware deletion and optional JSON persistence."""
import collections
import copy
import datetime
import json
import os
import queue
import threading
import uuid

import errors
from selection import match_fields, match_labels


def now_iso():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class Watcher:
    """A subscription; events arrive on .queue as (type, obj) or None at close."""

    def __init__(self, key, namespace, label_reqs, field_reqs):
        self.key, self.namespace = key, namespace
        self.label_reqs, self.field_reqs = label_reqs or [], field_reqs or []
        self.queue = queue.Queue()

    def matches(self, obj):
        if obj is None:
            return False
        md = obj.get("metadata") or {}
        if self.namespace and md.get("namespace", "") != self.namespace:
            return False
        return match_labels(self.label_reqs, md.get("labels")) and \
            match_fields(self.field_reqs, obj)

    def offer(self, key, etype, obj, old):
        """Translate an event for this watcher's filter (as the real server does:
        an object leaving the filter is a DELETED, entering it an ADDED)."""
        if key != self.key:
            return
        new_m = self.matches(obj)
        old_m = self.matches(old) if etype == "MODIFIED" else new_m
        if etype == "MODIFIED" and new_m != old_m:
            etype = "ADDED" if new_m else "DELETED"
        elif not new_m:
            return
        self.queue.put((etype, obj))


class Store:
    def __init__(self, registry, state_path=None, history=1000):
        self.registry = registry
        self.lock = threading.RLock()
        self.objects = {}                  # (key, ns, name) -> obj
        self.rv = 0
        self.history = collections.deque()  # (rv, key, type, obj, old)
        self.history_limit = history
        self.history_start = 0             # every event with rv > this is kept
        self.watchers = set()
        self.state_path = state_path
        # Hooks set by other modules.
        self.admit = lambda op, rt, new, old, sub: new    # validation/defaulting
        self.listeners = []                # fn(rt, type, obj) after each change
        self.graceful = lambda rt, obj: False  # kubelet: pod needs graceful stop
        self.allocate_cluster_ip = None        # kubelet: a Service address its proxy serves
        self.closed = False
        if state_path and os.path.exists(state_path):
            self._load()
        self.history_start = self.rv

    # ---- persistence -----------------------------------------------------
    def _load(self):
        with open(self.state_path) as f:
            state = json.load(f)
        self.rv = int(state.get("resourceVersion", 0))
        entries = state.get("objects", [])
        # CRDs first so that their custom resources have types on reload.
        entries.sort(key=lambda e: not e["key"].startswith("apiextensions.k8s.io/"))
        for e in entries:
            obj = e["object"]
            md = obj["metadata"]
            self.objects[(e["key"], md.get("namespace", ""), md["name"])] = obj

    def replay_load(self):
        """Run LOAD listeners (CRD registration) for objects from --state."""
        items = sorted(self.objects.items(),
                       key=lambda kv: not kv[0][0].startswith("apiextensions.k8s.io/"))
        for (key, _, _), obj in items:
            rt = self.registry.by_key(key)
            for fn in self.listeners:
                fn(rt, "LOAD", obj)

    def _save(self):
        if not self.state_path:
            return
        state = {"resourceVersion": self.rv,
                 "objects": [{"key": k[0], "object": o} for k, o in self.objects.items()]}
        tmp = "%s.tmp.%d" % (self.state_path, os.getpid())
        with open(tmp, "w") as f:
            json.dump(state, f)
        os.replace(tmp, self.state_path)

    # ---- events ------------------------------------------------------------
    def _emit(self, rt, etype, obj, old=None):
        obj = copy.deepcopy(obj)
        self.history.append((self.rv, rt.key, etype, obj, old))
        while len(self.history) > self.history_limit:
            self.history_start = self.history.popleft()[0]
        for w in list(self.watchers):
            w.offer(rt.key, etype, obj, old)
        self._save()
        for fn in self.listeners:
            fn(rt, etype, obj)

    def _next_rv(self):
        self.rv += 1
        return str(self.rv)

    # ---- reads ---------------------------------------------------------------
    def get(self, rt, ns, name):
        with self.lock:
            obj = self.objects.get((rt.key, ns, name))
            if obj is None:
                raise errors.not_found(rt, name)
            return copy.deepcopy(obj)

    def find(self, rt, ns, name):
        with self.lock:
            obj = self.objects.get((rt.key, ns, name))
            return copy.deepcopy(obj) if obj is not None else None

    def list(self, rt, ns="", label_reqs=None, field_reqs=None):
        w = Watcher(rt.key, ns, label_reqs, field_reqs)
        with self.lock:
            items = [copy.deepcopy(o) for (k, ons, _), o in sorted(self.objects.items())
                     if k == rt.key and w.matches(o)]
            return items, str(self.rv)

    def all_objects(self):
        with self.lock:
            return [(k[0], copy.deepcopy(o)) for k, o in self.objects.items()]

    # ---- writes ----------------------------------------------------------------
    def _check_namespace(self, rt, ns):
        if rt.namespaced:
            nsobj = self.objects.get(("/namespaces", "", ns))
            if nsobj is None:
                raise errors.namespace_not_found(ns)

    def create(self, rt, ns, obj):
        with self.lock:
            obj = copy.deepcopy(obj)
            md = obj.setdefault("metadata", {})
            if rt.namespaced:
                md["namespace"] = ns
            else:
                md.pop("namespace", None)
            if not md.get("name") and md.get("generateName"):
                md["name"] = md["generateName"] + uuid.uuid4().hex[:5]
            name = md.get("name")
            if not name:
                raise errors.invalid(rt, "", [("metadata.name", "FieldValueRequired",
                                               "Required value: name or generateName is required")])
            self._check_namespace(rt, ns)
            if (rt.key, ns, name) in self.objects:
                raise errors.already_exists(rt, name)
            obj["apiVersion"], obj["kind"] = rt.api_version, rt.kind
            for f in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds"):
                md.pop(f, None)
            md["uid"] = str(uuid.uuid4())
            md["creationTimestamp"] = now_iso()
            if rt.has_status and rt.crd_name:
                obj.pop("status", None)       # CRs: status only via /status
            obj = self.admit("create", rt, obj, None, None)
            md = obj["metadata"]
            if "spec" in obj or rt.crd_name:
                md["generation"] = 1
            md["resourceVersion"] = self._next_rv()
            self.objects[(rt.key, ns, name)] = obj
            self._emit(rt, "ADDED", obj)
            return copy.deepcopy(obj)

    def update(self, rt, ns, name, new, subresource=None, check_rv=True, dry_run=False):
        """PUT semantics; 409 on a stale metadata.resourceVersion."""
        with self.lock:
            old = self.objects.get((rt.key, ns, name))
            if old is None:
                raise errors.not_found(rt, name)
            want = (new.get("metadata") or {}).get("resourceVersion")
            if check_rv and want and want != old["metadata"]["resourceVersion"]:
                raise errors.conflict(rt, name)
            return self._replace(rt, ns, name, old, copy.deepcopy(new), subresource, dry_run)

    def mutate(self, rt, ns, name, fn, subresource=None, dry_run=False):
        """Read-modify-write under the lock (patches, controller updates)."""
        with self.lock:
            old = self.objects.get((rt.key, ns, name))
            if old is None:
                raise errors.not_found(rt, name)
            new = fn(copy.deepcopy(old))
            want = (new.get("metadata") or {}).get("resourceVersion")
            if want and want != old["metadata"]["resourceVersion"]:
                raise errors.conflict(rt, name)
            return self._replace(rt, ns, name, old, new, subresource, dry_run)

    def _replace(self, rt, ns, name, old, new, subresource, dry_run=False):
        omd = old["metadata"]
        if subresource == "status":
            # Status writes change only .status.
            status = new.get("status")
            new = copy.deepcopy(old)
            if status is None:
                new.pop("status", None)
            else:
                new["status"] = status
        else:
            if rt.has_status and "status" in old:
                new["status"] = copy.deepcopy(old["status"])
            elif rt.has_status:
                new.pop("status", None)
        md = new.setdefault("metadata", {})
        md["name"] = name
        if rt.namespaced:
            md["namespace"] = ns
        for f in ("uid", "creationTimestamp", "deletionTimestamp",
                  "deletionGracePeriodSeconds", "generation"):
            if f in omd:
                md[f] = omd[f]
            else:
                md.pop(f, None)
        new["apiVersion"], new["kind"] = old["apiVersion"], old["kind"]
        if subresource != "status":
            new = self.admit("update", rt, new, old, subresource)
            md = new["metadata"]
        if "generation" in omd and _spec_of(new) != _spec_of(old):
            md["generation"] = omd["generation"] + 1
        if omd.get("deletionTimestamp"):
            # A deleting object may lose finalizers but not gain new ones.
            md["finalizers"] = [f for f in md.get("finalizers") or []
                                if f in (omd.get("finalizers") or [])]
            if not md["finalizers"]:
                md.pop("finalizers")
        if _strip_rv(new) == _strip_rv(old):
            return copy.deepcopy(old)        # no-op writes keep the resourceVersion
        if dry_run:
            md["resourceVersion"] = omd["resourceVersion"]
            return copy.deepcopy(new)        # validated and defaulted, never stored
        md["resourceVersion"] = self._next_rv()
        if self._should_remove(rt, new):
            del self.objects[(rt.key, ns, name)]
            self._emit(rt, "DELETED", new)
            return copy.deepcopy(new)
        self.objects[(rt.key, ns, name)] = new
        self._emit(rt, "MODIFIED", new, old)
        return copy.deepcopy(new)

    def _should_remove(self, rt, obj):
        md = obj["metadata"]
        if not md.get("deletionTimestamp") or md.get("finalizers"):
            return False
        if rt.key == "/namespaces":
            return False                     # the GC empties it first
        return not (self.graceful(rt, obj) and md.get("deletionGracePeriodSeconds", 0) > 0)

    def delete(self, rt, ns, name, propagation=None, grace=None, preconditions=None):
        """Returns (obj, removed). Objects with finalizers or a graceful pod stop
        get a deletionTimestamp and stay until those are done."""
        with self.lock:
            obj = self.objects.get((rt.key, ns, name))
            if obj is None:
                raise errors.not_found(rt, name)
            md = obj["metadata"]
            pre = preconditions or {}
            if pre.get("uid") and pre["uid"] != md["uid"]:
                raise errors.conflict(rt, name, "Precondition failed: UID in precondition: "
                                      "%s, UID in object meta: %s" % (pre["uid"], md["uid"]))
            if pre.get("resourceVersion") and pre["resourceVersion"] != md["resourceVersion"]:
                raise errors.conflict(rt, name)
            new = copy.deepcopy(obj)
            nmd = new["metadata"]
            if propagation == "Orphan":
                self._orphan_dependents(md["uid"])
            if propagation == "Foreground" and not md.get("deletionTimestamp"):
                nmd.setdefault("finalizers", [])
                if "foregroundDeletion" not in nmd["finalizers"]:
                    nmd["finalizers"].append("foregroundDeletion")
            if rt.key == "/pods" and grace is None:
                grace = (new.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
            if md.get("deletionTimestamp"):
                # Already deleting: a shorter grace period may finish it now.
                if grace is not None and grace < md.get("deletionGracePeriodSeconds", 0):
                    nmd["deletionGracePeriodSeconds"] = grace
            else:
                nmd["deletionTimestamp"] = now_iso()
                nmd["deletionGracePeriodSeconds"] = grace or 0
                if rt.key == "/namespaces":
                    new.setdefault("status", {})["phase"] = "Terminating"
            if not nmd.get("finalizers") and not (
                    self.graceful(rt, new) and nmd["deletionGracePeriodSeconds"] > 0) \
                    and rt.key != "/namespaces":
                nmd["resourceVersion"] = self._next_rv()
                del self.objects[(rt.key, ns, name)]
                self._emit(rt, "DELETED", new)
                return copy.deepcopy(new), True
            if new != obj:
                nmd["resourceVersion"] = self._next_rv()
                self.objects[(rt.key, ns, name)] = new
                self._emit(rt, "MODIFIED", new, obj)
            return copy.deepcopy(new), False

    def remove_namespace(self, name):
        """Called by the GC once a terminating namespace is empty."""
        rt = self.registry.lookup("", "v1", "namespaces")
        with self.lock:
            obj = self.objects.pop(("/namespaces", "", name), None)
            if obj is not None:
                obj = copy.deepcopy(obj)
                obj["metadata"]["resourceVersion"] = self._next_rv()
                self._emit(rt, "DELETED", obj)

    def _orphan_dependents(self, uid):
        for (key, ns, name), obj in list(self.objects.items()):
            refs = obj["metadata"].get("ownerReferences") or []
            if any(r.get("uid") == uid for r in refs):
                rt = self.registry.by_key(key)

                def drop(o, uid=uid):
                    o["metadata"]["ownerReferences"] = [
                        r for r in o["metadata"].get("ownerReferences") or []
                        if r.get("uid") != uid]
                    if not o["metadata"]["ownerReferences"]:
                        del o["metadata"]["ownerReferences"]
                    return o
                self.mutate(rt, ns, name, drop)

    def drop_type(self, rt):
        """Delete every object of a type (its CRD went away)."""
        with self.lock:
            for k in [k for k in self.objects if k[0] == rt.key]:
                obj = self.objects.pop(k)
                obj["metadata"]["resourceVersion"] = self._next_rv()
                self._emit(rt, "DELETED", obj)

    # ---- watch -------------------------------------------------------------------
    def watch(self, rt, ns, label_reqs, field_reqs, since_rv, initial):
        """Register a watcher. since_rv=None/0 with initial=True replays the
        current state as ADDED events; an rv older than the history window
        raises 410 Gone."""
        w = Watcher(rt.key, ns, label_reqs, field_reqs)
        with self.lock:
            if initial:
                for (k, _, _), o in sorted(self.objects.items()):
                    if k == rt.key and w.matches(o):
                        w.queue.put(("ADDED", copy.deepcopy(o)))
            else:
                rv = int(since_rv)
                if rv < self.history_start:
                    raise errors.gone("too old resource version: %d (%d)"
                                      % (rv, self.history_start + 1))
                for erv, key, etype, obj, old in self.history:
                    if erv > rv:
                        w.offer(key, etype, obj, old)
            self.watchers.add(w)
        return w

    def unwatch(self, w):
        with self.lock:
            self.watchers.discard(w)

    def close(self):
        with self.lock:
            self.closed = True
            for w in self.watchers:
                w.queue.put(None)
            self.watchers.clear()
            self._save()


def _spec_of(obj):
    """What counts as 'spec' for generation: everything but metadata/status."""
    return {k: v for k, v in obj.items() if k not in ("metadata", "status")}


def _strip_rv(obj):
    o = dict(obj)
    md = dict(o.get("metadata") or {})
    md.pop("resourceVersion", None)
    md.pop("managedFields", None)
    o["metadata"] = md
    return o
