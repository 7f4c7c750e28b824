"""Garbage collector: ownerReferences cascading, foreground deletion and
namespace termination, done by a background sweep like the real controller.

`delay` (--gc-delay) is how long a dependent outlives its deleted owner: the real
collector works in the background, seconds after `kubectl delete` returned, and a
controller must not take a leftover of the old owner for the new one's."""
import threading
import time

import errors


class GarbageCollector:
    def __init__(self, store, interval=0.5, delay=0.0):
        self.store, self.interval, self.delay = store, interval, delay
        self.orphaned_at = {}                  # uid -> when it was first seen without an owner
        self.wake = threading.Event()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="gc", daemon=True)
        store.listeners.append(self._on_event)

    def start(self):
        self.thread.start()

    def stop(self):
        self.stopped.set()
        self.wake.set()

    def _on_event(self, rt, etype, obj):
        md = obj.get("metadata") or {}
        if etype == "DELETED" or md.get("deletionTimestamp"):
            self.wake.set()

    def _run(self):
        while not self.stopped.is_set():
            self.wake.wait(self.interval)
            self.wake.clear()
            try:
                self.sweep()
            except Exception as e:  # keep collecting; a failed sweep is retried
                print("gc: sweep failed: %r" % (e,), flush=True)

    def _delete(self, key, obj, propagation="Background"):
        rt = self.store.registry.by_key(key)
        md = obj["metadata"]
        if rt is None or md.get("deletionTimestamp"):
            return
        try:
            self.store.delete(rt, md.get("namespace", ""), md["name"], propagation,
                              preconditions={"uid": md["uid"]})
        except errors.ApiError:
            pass                               # already gone or replaced

    def sweep(self):
        objs = self.store.all_objects()
        live = {o["metadata"]["uid"]: (k, o) for k, o in objs}
        dependents = {}
        for key, obj in objs:
            for ref in obj["metadata"].get("ownerReferences") or []:
                dependents.setdefault(ref.get("uid"), []).append((key, obj, ref))

        now = time.monotonic()
        orphaned = {}
        for key, obj in objs:
            md = obj["metadata"]
            refs = md.get("ownerReferences") or []
            # Background cascade: every owner is gone (for `delay` seconds).
            if refs and not any(r.get("uid") in live for r in refs):
                since = orphaned[md["uid"]] = self.orphaned_at.get(md["uid"], now)
                if now - since >= self.delay:
                    self._delete(key, obj)
            # Foreground: delete dependents, release the owner when the
            # blocking ones are gone.
            if md.get("deletionTimestamp") and "foregroundDeletion" in (md.get("finalizers") or []):
                deps = dependents.get(md["uid"], [])
                for dkey, dobj, _ in deps:
                    self._delete(dkey, dobj, "Foreground")
                if not any(ref.get("blockOwnerDeletion") for _, _, ref in deps):
                    self._drop_finalizer(key, obj, "foregroundDeletion")
        self.orphaned_at = orphaned
        self._namespaces(objs)

    def _drop_finalizer(self, key, obj, finalizer):
        rt = self.store.registry.by_key(key)
        md = obj["metadata"]

        def drop(o):
            o["metadata"]["finalizers"] = [f for f in o["metadata"].get("finalizers") or []
                                           if f != finalizer]
            o["metadata"].pop("resourceVersion", None)
            return o
        try:
            self.store.mutate(rt, md.get("namespace", ""), md["name"], drop)
        except errors.ApiError:
            pass

    def _namespaces(self, objs):
        terminating = {o["metadata"]["name"] for k, o in objs
                       if k == "/namespaces" and o["metadata"].get("deletionTimestamp")}
        if not terminating:
            return
        busy = set()
        for key, obj in objs:
            ns = obj["metadata"].get("namespace")
            if ns in terminating and key != "/namespaces":
                busy.add(ns)
                self._delete(key, obj)
        for ns in terminating - busy:
            self.store.remove_namespace(ns)
