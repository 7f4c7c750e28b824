"""Service proxy (what kube-proxy does), for Services with a selector and a cluster IP.

Each such Service gets a loopback cluster IP of this stand-in (127.<octet>.254.N, see
Kubelet.allocate_cluster_ip) and the kubelet publishes its DNS names with that address.
For every service port a listener on CLUSTER_IP:PORT forwards each TCP connection to one
endpoint picked at connect time: a Ready, not terminating pod of the namespace that
matches the selector, at the service's targetPort (a number, or a container port name
resolved in that pod). No endpoint: the connection is closed at once (a real cluster
refuses or times out). Headless Services (clusterIP None) keep resolving to pod IPs.
"""
import random
import socket
import threading

from selection import match_labels


class ServiceProxy:
    def __init__(self, store, registry):
        self.store, self.registry = store, registry
        self.lock = threading.Lock()
        self.listeners = {}        # (ns, name, port) -> (socket, cluster ip, port spec)
        self.stopped = threading.Event()

    def sync(self):
        """Open listeners for new service ports, close those of removed ones."""
        svc_rt = self.registry.lookup("", "v1", "services")
        want = {}
        for svc in self.store.list(svc_rt)[0]:
            spec = svc.get("spec") or {}
            ip = spec.get("clusterIP") or ""
            if not spec.get("selector") or not ip.startswith("127."):
                continue
            for p in spec.get("ports") or []:
                if (p.get("protocol") or "TCP") == "TCP" and p.get("port"):
                    want[(svc["metadata"]["namespace"], svc["metadata"]["name"], int(p["port"]))] = (ip, p)
        with self.lock:
            for key in [k for k in self.listeners if k not in want]:
                self.listeners.pop(key)[0].close()
            for key, (ip, p) in want.items():
                if key in self.listeners:
                    continue
                sock = socket.socket()
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    sock.bind((ip, key[2]))
                    sock.listen(64)
                except OSError as e:
                    sock.close()
                    print("proxy: cannot listen on %s:%d for service %s/%s: %s" % (ip, key[2], key[0], key[1], e),
                          flush=True)
                    continue
                self.listeners[key] = (sock, ip, p)
                threading.Thread(target=self._accept, args=(key, sock), daemon=True,
                                 name="proxy-%s-%s-%d" % key).start()

    def stop(self):
        self.stopped.set()
        with self.lock:
            for sock, _, _ in self.listeners.values():
                sock.close()
            self.listeners.clear()

    def _endpoint(self, key):
        ns, name, port = key
        svc = self.store.find(self.registry.lookup("", "v1", "services"), ns, name)
        if svc is None:
            return None
        sel = (svc.get("spec") or {}).get("selector") or {}
        target = next((p.get("targetPort", port) for p in svc["spec"].get("ports") or []
                       if int(p.get("port", 0)) == port), port)
        cands = []
        for pod in self.store.list(self.registry.lookup("", "v1", "pods"), ns)[0]:
            st = pod.get("status") or {}
            ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or [])
            if not ready or pod["metadata"].get("deletionTimestamp") or not st.get("podIP"):
                continue
            if not match_labels([(k, "=", [v]) for k, v in sel.items()], pod["metadata"].get("labels")):
                continue
            tp = target
            if isinstance(tp, str) and not tp.isdigit():
                tp = next((cp.get("containerPort") for c in pod["spec"].get("containers") or []
                           for cp in c.get("ports") or [] if cp.get("name") == target), None)
            if tp:
                cands.append((st["podIP"], int(tp)))
        return random.choice(cands) if cands else None

    def _accept(self, key, sock):
        while not self.stopped.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                return                        # closed
            threading.Thread(target=self._forward, args=(key, conn), daemon=True).start()

    def _forward(self, key, conn):
        ep = self._endpoint(key)
        if ep is None:
            conn.close()
            return
        try:
            upstream = socket.create_connection(ep, timeout=5)
            upstream.settimeout(None)
        except OSError:
            conn.close()
            return
        back = threading.Thread(target=_pump, args=(upstream, conn), daemon=True)
        back.start()
        _pump(conn, upstream)
        back.join()
        conn.close()
        upstream.close()


def _pump(src, dst):
    """Copies until src ends, then passes the end on (half close)."""
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    try:
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass
