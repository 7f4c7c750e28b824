"""The HTTP side: URL routing, request decoding and responses following the
Kubernetes REST conventions (discovery, CRUD, patch, watch, tables)."""
import base64
import json
import socket
import threading
import time
import urllib.parse
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import admission
import auth as authmod
import errors
import openapi
import patch as patches
import protobuf
import scale
import tables
from selection import parse_field_selector, parse_label_selector
from store import now_iso
from watchstream import stream_watch, ChunkedWriter

VERSION = {"major": "1", "minor": "33", "gitVersion": "v1.33.0-standin",
           "gitCommit": "0000000000000000000000000000000000000000",
           "gitTreeState": "clean", "buildDate": "2025-01-01T00:00:00Z",
           "goVersion": "go1.24", "compiler": "gc", "platform": "linux/amd64"}


class ApiServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, addr, store, registry, kubelet=None, bookmark_interval=5.0,
                 verbose=False, auth=None):
        super().__init__(addr, Handler)
        self.store, self.registry, self.kubelet = store, registry, kubelet
        self.auth = auth or authmod.Auth(store, registry)
        # Every write request (POST, PUT, PATCH, DELETE on a resource), for tests that count
        # what a client writes (GET /standin/writes).
        self.writes = []
        self.writes_lock = threading.Lock()
        # POST /standin/hold: requests to hold before they are served (a slow server, a
        # request in flight while its client is paused).
        self.holds = []
        self.bookmark_interval = bookmark_interval
        self.verbose = verbose
        self.stopping = False


class Request:
    """A parsed resource URL."""

    def __init__(self, rt, namespace, name, sub, watch):
        self.rt, self.namespace, self.name, self.sub, self.watch = \
            rt, namespace, name, sub, watch


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "edit-apiserver-standin/1"

    def setup(self):
        super().setup()
        # Small responses and watch events must not wait for Nagle + delayed ACK.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, fmt, *args):
        if self.server.verbose:
            super().log_message(fmt, *args)

    # ---- plumbing ---------------------------------------------------------
    def do_GET(self):
        self._dispatch("GET")

    def do_POST(self):
        self._dispatch("POST")

    def do_PUT(self):
        self._dispatch("PUT")

    def do_PATCH(self):
        self._dispatch("PATCH")

    def do_DELETE(self):
        self._dispatch("DELETE")

    def _dispatch(self, method):
        url = urllib.parse.urlsplit(self.path)
        self.query = {k: v[-1] for k, v in urllib.parse.parse_qs(
            url.query, keep_blank_values=True).items()}
        self.url_path = url.path
        admission.request_ctx.user = None
        self.write = None
        try:
            self.user = self.server.auth.authenticate(self.headers.get("Authorization"))
            admission.request_ctx.user = self.user
            self.body = self._read_body()
            self._route(method, url.path.rstrip("/") or "/")
            self._record_write(200)
        except errors.ApiError as e:
            self._record_write(e.code)
            self._send_json(e.code, e.status())
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as e:  # a bug here must not kill the connection thread silently
            import traceback
            traceback.print_exc()
            self._send_json(500, errors.ApiError(500, "InternalError", repr(e)).status())

    def _hold(self, verb, req):
        """Sleeps before serving the first request a hold matches (each hold is used once)."""
        what = {"user": self.user.name, "verb": verb, "resource": req.rt.plural,
                "subresource": req.sub or "", "name": req.name or ""}
        with self.server.writes_lock:
            hold = next((h for h in self.server.holds
                         if all(h.get(k) in (None, v) for k, v in what.items())), None)
            if hold is not None:
                self.server.holds.remove(hold)
        if hold is not None:
            time.sleep(float(hold.get("seconds", 0)))

    def _record_write(self, code):
        if self.write is None:
            return
        self.write["code"] = code
        with self.server.writes_lock:
            self.server.writes.append(self.write)
            del self.server.writes[:-100000]

    def _read_body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    return data
                data += self.rfile.read(size)
                self.rfile.readline()
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _json_body(self):
        ctype = (self.headers.get("Content-Type") or "application/json").split(";")[0].strip()
        if ctype == "application/vnd.kubernetes.protobuf" and self.command in ("POST", "PUT"):
            try:
                return protobuf.decode(self.body)
            except (ValueError, IndexError) as e:
                raise errors.ApiError(415, "UnsupportedMediaType", str(e))
        if "protobuf" in ctype or "yaml" in ctype and ctype != "application/apply-patch+yaml":
            raise errors.unsupported_media(ctype)
        try:
            return json.loads(self.body or b"null")
        except ValueError as e:
            raise errors.bad_request("the request body is not valid JSON: %s" % e)

    def _send_json(self, code, obj, ctype="application/json"):
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _send_text(self, code, text, ctype="text/plain; charset=utf-8"):
        data = text.encode() if isinstance(text, str) else text
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    # ---- routing ------------------------------------------------------------
    def _route(self, method, path):
        reg = self.server.registry
        if path == "/version":
            return self._send_json(200, VERSION)
        if path in ("/healthz", "/readyz", "/livez"):
            return self._send_text(200, "ok")
        if path == "/api":
            return self._send_json(200, reg.api_versions())
        if path == "/apis":
            return self._send_json(200, reg.api_group_list())
        if path.startswith("/openapi/"):
            return self._openapi(path)
        if path.startswith("/standin/"):
            return self._standin(method, path)
        parts = path.strip("/").split("/")
        if parts[0] == "api" and len(parts) >= 2:
            group, version, rest = "", parts[1], parts[2:]
        elif parts[0] == "apis" and len(parts) >= 2:
            if len(parts) == 2:
                doc = reg.api_group(parts[1])
                if doc is None:
                    raise _not_found_path()
                return self._send_json(200, doc)
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise _not_found_path()
        if not rest:
            doc = reg.resource_list(group, version)
            if doc is None:
                raise _not_found_path()
            return self._send_json(200, doc)
        req = self._parse_resource(group, version, rest)
        if method != "GET":
            self.write = {"time": time.time(), "verb": _verb(method, req), "group": req.rt.group,
                          "resource": req.rt.plural, "subresource": req.sub or "",
                          "namespace": req.namespace or "", "name": req.name or "",
                          "userAgent": self.headers.get("User-Agent") or "", "user": self.user.name,
                          "dryRun": self._dry_run()}
        self.server.auth.authorize(self.user, authmod.Attributes(
            _verb(method, req), req.rt.group, req.rt.plural, req.sub, req.namespace, req.name))
        self._hold(_verb(method, req), req)
        handler = {"GET": self._get, "POST": self._post, "PUT": self._put,
                   "PATCH": self._patch, "DELETE": self._delete}[method]
        admission.request_ctx.field_validation = self.query.get("fieldValidation", "")
        return handler(req)

    def _parse_resource(self, group, version, rest):
        watch = False
        if rest[0] == "watch":
            watch, rest = True, rest[1:]
        ns = ""
        if len(rest) >= 3 and rest[0] == "namespaces" and not (
                len(rest) == 3 and rest[2] in ("status", "finalize")):
            ns, rest = rest[1], rest[2:]
        if not rest or len(rest) > 3:
            raise _not_found_path()
        rt = self.server.registry.lookup(group, version, rest[0])
        if rt is None or (ns and not rt.namespaced):
            raise _not_found_path()
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        if name and rt.namespaced and not ns:
            raise _not_found_path()
        if sub and sub not in rt.subresources:
            raise _not_found_path()
        return Request(rt, ns, name, sub, watch or self.query.get("watch") in ("true", "1"))

    def _out(self, rt, obj):
        obj["apiVersion"] = rt.api_version     # served version (no conversion)
        return obj

    # ---- reads --------------------------------------------------------------------
    def _accept_as(self):
        accept = self.headers.get("Accept") or ""
        for part in accept.split(","):
            if "g=meta.k8s.io" in part and "as=Table" in part:
                return "Table"
            if "g=meta.k8s.io" in part and "as=PartialObjectMetadata" in part:
                return "Partial"
        return None

    def _get(self, req):
        st = self.server.store
        if req.sub == "log":
            return self._logs(req)
        if req.name:
            if req.sub and req.sub not in ("status", "scale"):
                raise errors.method_not_allowed()
            if req.sub == "scale":
                return self._send_json(200, scale.of(req.rt, st.get(req.rt, req.namespace, req.name)))
            obj = self._out(req.rt, st.get(req.rt, req.namespace, req.name))
            as_ = self._accept_as()
            if as_ == "Table":
                return self._send_json(200, tables.table(
                    req.rt, [obj], self.query.get("includeObject", "Metadata")))
            if as_ == "Partial":
                obj = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                       "metadata": obj["metadata"]}
            return self._send_json(200, obj)
        labels = parse_label_selector(self.query.get("labelSelector"))
        fields = parse_field_selector(self.query.get("fieldSelector"))
        if req.watch:
            return stream_watch(self, req, labels, fields)
        if self.query.get("resourceVersionMatch") == "Exact":
            rv = int(self.query.get("resourceVersion") or 0)
            if rv < st.history_start:
                raise errors.gone("too old resource version: %d (%d)"
                                  % (rv, st.history_start + 1))
        items, rv = st.list(req.rt, req.namespace, labels, fields)
        items, cont = self._paginate(items)
        items = [self._out(req.rt, o) for o in items]
        as_ = self._accept_as()
        if as_ == "Table":
            return self._send_json(200, tables.table(
                req.rt, items, self.query.get("includeObject", "Metadata"), rv, cont))
        md = {"resourceVersion": rv}
        if cont:
            md["continue"] = cont
        if as_ == "Partial":
            return self._send_json(200, {
                "kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1",
                "metadata": md, "items": [{"kind": "PartialObjectMetadata",
                                           "apiVersion": "meta.k8s.io/v1",
                                           "metadata": o["metadata"]} for o in items]})
        return self._send_json(200, {"kind": req.rt.kind + "List",
                                     "apiVersion": req.rt.api_version,
                                     "metadata": md, "items": items})

    def _paginate(self, items):
        key = lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"])
        token = self.query.get("continue")
        if token:
            try:
                last = tuple(json.loads(base64.urlsafe_b64decode(token.encode())))
            except ValueError:
                raise errors.bad_request("invalid continue token")
            items = [o for o in items if key(o) > last]
        limit = int(self.query.get("limit") or 0)
        if limit and len(items) > limit:
            items = items[:limit]
            return items, base64.urlsafe_b64encode(json.dumps(key(items[-1])).encode()).decode()
        return items, None

    def _logs(self, req):
        kubelet = self.server.kubelet
        st = self.server.store
        pod = st.get(req.rt, req.namespace, req.name)
        containers = [c["name"] for c in pod["spec"].get("containers") or []]
        cname = self.query.get("container") or (containers[0] if len(containers) == 1 else "")
        if not cname:
            raise errors.bad_request("a container name must be specified for pod %s, choose "
                                     "one of: %s" % (req.name, containers))
        path = kubelet.log_path(pod, cname) if kubelet else None
        if not path:
            raise errors.bad_request('container "%s" in pod "%s" is waiting to start: '
                                     'ContainerCreating' % (cname, req.name))
        with open(path, "rb") as f:
            data = f.read()
        tail = self.query.get("tailLines")
        if tail is not None:
            lines = data.splitlines(True)
            data = b"".join(lines[-int(tail):]) if int(tail) else b""
        if self.query.get("follow") not in ("true", "1"):
            return self._send_text(200, data)
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        out = ChunkedWriter(self.wfile)
        out.write(data)
        with open(path, "rb") as f:
            f.seek(0, 2)
            while not self.server.stopping:
                chunk = f.read(65536)
                if chunk:
                    out.write(chunk)
                    continue
                if not kubelet.container_running(pod, cname):
                    break
                time.sleep(0.2)
        out.close()

    def _openapi(self, path):
        docs = openapi.documents(self.server.registry)
        if path == "/openapi/v3":
            return self._send_json(200, openapi.index(docs))
        if path.startswith("/openapi/v3/"):
            gv = path[len("/openapi/v3/"):]
            if gv in docs:
                return self._send_json(200, docs[gv][0])
        raise _not_found_path()

    # ---- writes ---------------------------------------------------------------------
    def _object_body(self, req):
        obj = self._json_body()
        if not isinstance(obj, dict):
            raise errors.bad_request("Object 'Kind' is missing in '%s'" % self.body[:100])
        kind = obj.get("kind")
        if kind and kind != req.rt.kind:
            raise errors.bad_request("the API version in the data (%s) does not match the "
                                     "expected API version (%s)"
                                     % (obj.get("apiVersion"), req.rt.api_version)
                                     if obj.get("apiVersion") != req.rt.api_version else
                                     "%s in version \"%s\" cannot be handled as a %s"
                                     % (kind, req.rt.version, req.rt.kind))
        md = obj.get("metadata") or {}
        if req.rt.namespaced and md.get("namespace") and req.namespace and \
                md["namespace"] != req.namespace:
            raise errors.bad_request("the namespace of the provided object does not match "
                                     "the namespace sent on the request")
        return obj

    def _dry_run(self):
        return self.query.get("dryRun") == "All"

    def _post(self, req):
        if req.sub == "eviction" and req.rt.key == "/pods":
            return self._evict(req)
        if req.sub == "token" and req.rt.key == "/serviceaccounts":
            return self._token(req)
        if req.name:
            raise errors.method_not_allowed()
        obj = self._object_body(req)
        st = self.server.store
        if self._dry_run():
            # As a real server's dry run: the object as it would be stored, with a UID and a
            # creation time that are never persisted (admission plugins may read them).
            md = obj.setdefault("metadata", {})
            md["namespace"] = req.namespace
            md["uid"] = str(uuid.uuid4())
            md["creationTimestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            return self._send_json(201, st.admit("create", req.rt, obj, None, None))
        return self._send_json(201, self._out(req.rt, st.create(req.rt, req.namespace, obj)))

    def _put(self, req):
        if not req.name or req.sub not in (None, "status", "finalize", "scale"):
            raise errors.method_not_allowed()
        if req.sub == "scale":
            body = self._json_body()
            return self._scale_write(req, lambda _old: body)
        obj = self._object_body(req)
        st = self.server.store
        sub = "status" if req.sub == "status" else None
        out = st.update(req.rt, req.namespace, req.name, obj, sub, dry_run=self._dry_run())
        return self._send_json(200, self._out(req.rt, out))

    def _patch(self, req):
        if not req.name or req.sub not in (None, "status", "scale"):
            raise errors.method_not_allowed()
        ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip()
        body = self._json_body()
        st = self.server.store
        if ctype == "application/merge-patch+json":
            fn = lambda old: patches.merge_patch(old, body)
        elif ctype == "application/json-patch+json":
            fn = lambda old: patches.json_patch(old, body)
        elif ctype == "application/strategic-merge-patch+json":
            if req.rt.crd_name and req.sub != "scale":   # Scale is a built-in kind
                raise errors.unsupported_media(ctype)   # as the real server
            fn = lambda old: patches.strategic_merge(old, body)
        elif ctype == "application/apply-patch+yaml":
            # Server-side apply approximated by a merge patch; creates if absent.
            if req.sub is None and st.find(req.rt, req.namespace, req.name) is None:
                body.setdefault("metadata", {})["name"] = req.name
                out = st.create(req.rt, req.namespace, body)
                return self._send_json(201, self._out(req.rt, out))
            fn = lambda old: patches.merge_patch(old, body)
        else:
            raise errors.unsupported_media(ctype)
        if not isinstance(body, (dict, list)):
            raise errors.bad_request("invalid patch body")
        if req.sub == "scale":
            return self._scale_write(req, fn)
        out = st.mutate(req.rt, req.namespace, req.name, fn,
                        "status" if req.sub == "status" else None, dry_run=self._dry_run())
        return self._send_json(200, self._out(req.rt, out))

    def _scale_write(self, req, change):
        """PUT/PATCH of a custom resource's /scale: change(old Scale) gives the new Scale,
        whose spec.replicas is written to the object; that is then an update of the main
        resource (schema, CEL with oldSelf, generation, resourceVersion check, watch)."""
        fn = lambda obj: scale.apply(req.rt, obj, change(scale.of(req.rt, obj)), req.name)
        out = self.server.store.mutate(req.rt, req.namespace, req.name, fn,
                                       dry_run=self._dry_run())
        return self._send_json(200, scale.of(req.rt, out))

    def _evict(self, req):
        """The Eviction API (what kubectl drain calls): the pod gets the DisruptionTarget
        condition and is deleted with its grace period. No PodDisruptionBudgets."""
        st = self.server.store
        body = self._json_body() or {}
        grace = ((body.get("deleteOptions") or {}).get("gracePeriodSeconds"))

        def mark(pod):
            conds = [c for c in (pod.get("status") or {}).get("conditions") or []
                     if c.get("type") != "DisruptionTarget"]
            conds.append({"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
                          "message": "Eviction API: evicting", "lastTransitionTime": now_iso()})
            pod.setdefault("status", {})["conditions"] = conds
            return pod
        st.mutate(req.rt, req.namespace, req.name, mark, "status")
        st.delete(req.rt, req.namespace, req.name, None, grace)
        return self._send_json(201, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                     "status": "Success", "code": 201})

    def _token(self, req):
        """TokenRequest (kubectl create token): a token of the ServiceAccount (see auth.py)."""
        body = self._json_body() or {}
        seconds = int((body.get("spec") or {}).get("expirationSeconds") or 3600)
        token = self.server.auth.issue_token(req.namespace, req.name)
        expires = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + seconds))
        return self._send_json(201, {
            "kind": "TokenRequest", "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"name": req.name, "namespace": req.namespace, "creationTimestamp": now_iso()},
            "spec": dict(body.get("spec") or {}, expirationSeconds=seconds),
            "status": {"token": token, "expirationTimestamp": expires}})

    def _delete_options(self):
        opts = {}
        if self.body:
            try:
                opts = json.loads(self.body) or {}
            except ValueError:
                raise errors.bad_request("invalid DeleteOptions body")
        prop = self.query.get("propagationPolicy") or opts.get("propagationPolicy")
        orphan = self.query.get("orphanDependents", opts.get("orphanDependents"))
        if prop is None and orphan in (True, "true"):
            prop = "Orphan"
        if prop not in (None, "Background", "Foreground", "Orphan"):
            raise errors.bad_request("unsupported propagationPolicy %r" % prop)
        grace = self.query.get("gracePeriodSeconds", opts.get("gracePeriodSeconds"))
        return prop, (int(grace) if grace is not None else None), opts.get("preconditions")

    def _delete(self, req):
        st = self.server.store
        prop, grace, pre = self._delete_options()
        if req.name is None:
            labels = parse_label_selector(self.query.get("labelSelector"))
            fields = parse_field_selector(self.query.get("fieldSelector"))
            items, _ = st.list(req.rt, req.namespace, labels, fields)
            out = []
            for o in items:
                try:
                    out.append(st.delete(req.rt, o["metadata"].get("namespace", ""),
                                         o["metadata"]["name"], prop, grace)[0])
                except errors.ApiError:
                    pass
            return self._send_json(200, {"kind": req.rt.kind + "List",
                                         "apiVersion": req.rt.api_version,
                                         "metadata": {"resourceVersion": str(st.rv)},
                                         "items": out})
        if req.sub:
            raise errors.method_not_allowed()
        if self._dry_run():
            return self._send_json(200, st.get(req.rt, req.namespace, req.name))
        obj, _removed = st.delete(req.rt, req.namespace, req.name, prop, grace, pre)
        return self._send_json(200, self._out(req.rt, obj))

    # ---- test hooks outside the Kubernetes API ------------------------------------------
    def _standin(self, method, path):
        kubelet = self.server.kubelet
        if path == "/standin/kill" and method == "POST":
            if kubelet is None:
                raise errors.bad_request("the stand-in runs without --kubelet")
            pids = kubelet.signal(self.query.get("namespace", "default"),
                                  self.query.get("pod", ""),
                                  self.query.get("signal", "KILL"),
                                  self.query.get("container"))
            return self._send_json(200, {"signalled": pids})
        if path == "/standin/processes" and kubelet is not None:
            return self._send_json(200, kubelet.processes())
        if path == "/standin/audit":
            return self._send_json(200, self.server.auth.audit_log())
        if path == "/standin/hold" and method == "POST":
            # {"user", "verb", "resource", "subresource", "name" (each optional), "seconds"}:
            # the next request that matches is served that many seconds later.
            hold = self._json_body()
            with self.server.writes_lock:
                self.server.holds.append(hold)
            return self._send_json(200, hold)
        if path == "/standin/writes":
            # ?resource=editjobs&subresource=status&since=UNIX: filters, all optional.
            with self.server.writes_lock:
                out = [w for w in self.server.writes
                       if all(str(w.get(k)) == self.query[k] for k in ("resource", "subresource", "namespace", "name")
                              if k in self.query)
                       and w["time"] >= float(self.query.get("since") or 0)]
            return self._send_json(200, out)
        if path == "/standin/state":
            st = self.server.store
            return self._send_json(200, {"resourceVersion": st.rv,
                                         "historyStart": st.history_start,
                                         "watchers": len(st.watchers)})
        raise _not_found_path()


def _verb(method, req):
    """The RBAC verb of a request."""
    if method == "GET":
        return "get" if req.name else ("watch" if req.watch else "list")
    if method == "DELETE":
        return "delete" if req.name else "deletecollection"
    return {"POST": "create", "PUT": "update", "PATCH": "patch"}[method]


def _not_found_path():
    return errors.ApiError(404, "NotFound", "the server could not find the requested resource",
                           {"causes": [{"reason": "UnexpectedServerResponse",
                                        "message": "404 page not found"}]})
