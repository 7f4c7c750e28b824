"""Watch responses: newline-delimited JSON events over a chunked HTTP/1.1
response, with bookmarks, timeouts and 410 Gone as an ERROR event."""
import json
import queue
import random
import select
import time

import errors
import tables

IDLE_POLL = 1.0          # how often an idle watch checks for a closed client


class ChunkedWriter:
    def __init__(self, wfile):
        self.wfile = wfile

    def write(self, data):
        if data:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

    def close(self):
        try:
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            pass


def _client_gone(handler):
    """True when the client closed its side (readable with no data)."""
    try:
        r, _, _ = select.select([handler.connection], [], [], 0)
        if r:
            return handler.connection.recv(1, 0x2) == b""    # MSG_PEEK
    except OSError:
        return True
    return False


def stream_watch(handler, req, labels, fields):
    server, q = handler.server, handler.query
    st = server.store
    rv = q.get("resourceVersion") or ""
    send_initial = q.get("sendInitialEvents") == "true"
    initial = send_initial or rv in ("", "0")
    bookmarks = q.get("allowWatchBookmarks") in ("true", "1")
    timeout = float(q.get("timeoutSeconds") or 0) or random.uniform(1800, 3600)
    as_table = handler._accept_as() == "Table"
    include = q.get("includeObject", "Metadata")

    if not rv.isdigit() and rv != "":
        raise errors.bad_request("invalid resource version %r" % rv)
    try:
        w = st.watch(req.rt, req.namespace, labels, fields, rv or 0, initial)
        failure = None
    except errors.ApiError as e:
        w, failure = None, e
    try:
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.send_header("Cache-Control", "no-cache, private")
        handler.end_headers()
    except OSError:
        if w is not None:
            st.unwatch(w)
        raise
    out = ChunkedWriter(handler.wfile)

    def send(etype, obj):
        if as_table and etype in ("ADDED", "MODIFIED", "DELETED"):
            obj = tables.table(req.rt, [obj], include)
        out.write(json.dumps({"type": etype, "object": obj}).encode() + b"\n")

    if failure is not None:
        # A real server answers 200 and then an ERROR event for a too old rv.
        send("ERROR", failure.status())
        out.close()
        return
    deadline = time.monotonic() + timeout
    next_bookmark = time.monotonic() + server.bookmark_interval
    pending_initial_end = send_initial and bookmarks
    try:
        while not server.stopping:
            now = time.monotonic()
            if now >= deadline:
                break
            if pending_initial_end and w.queue.empty():
                pending_initial_end = not _bookmark(st, w, req, send, initial_end=True)
            wait = min(deadline, next_bookmark if bookmarks else now + IDLE_POLL) - now
            try:
                item = w.queue.get(timeout=max(0.01, min(wait, IDLE_POLL)))
            except queue.Empty:
                if bookmarks and time.monotonic() >= next_bookmark:
                    _bookmark(st, w, req, send)
                    next_bookmark = time.monotonic() + server.bookmark_interval
                elif _client_gone(handler):
                    break
                continue
            if item is None:
                break
            etype, obj = item
            obj = dict(obj)
            obj["apiVersion"] = req.rt.api_version
            send(etype, obj)
    except OSError:
        handler.close_connection = True
        return
    finally:
        st.unwatch(w)
    out.close()


def _bookmark(st, w, req, send, initial_end=False):
    """Only when every queued event was sent, so the bookmark's rv covers them."""
    with st.lock:
        if not w.queue.empty():
            return False
        rv = str(st.rv)
    md = {"resourceVersion": rv}
    if initial_end:
        md["annotations"] = {"k8s.io/initial-events-end": "true"}
    send("BOOKMARK", {"kind": req.rt.kind, "apiVersion": req.rt.api_version, "metadata": md})
    return True
