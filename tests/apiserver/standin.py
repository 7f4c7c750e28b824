#!/usr/bin/env python3
"""Kubernetes API server stand-in (test tooling; Python standard library only).

  python3 tests/apiserver/standin.py --listen 127.0.0.1:0 --ready-file PATH \
      [--state PATH] [--kubeconfig-out PATH] [--kubelet] [--kubelet-workdir DIR] \
      [--kubelet-images] [--path-prepend DIR]... [--nodes N] [--watch-history N] [--bookmark-interval S]
      [--gc-delay S] [--node-capacity cpu=N,memory=Q,...] [--storage-class NAME]... [--kueue-gate]

See README.md beside this file for what it serves and what it does not.
"""
import argparse
import os
import signal
import sys
import threading

# Its own modules come from beside it: a script's folder is first on sys.path.
import admission
import auth as authmod
import garbage
import quantity
import http_api
import registry as registrymod
import store as storemod

SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")


def write_atomic(path, text):
    tmp = "%s.tmp.%d" % (path, os.getpid())
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def kubeconfig(url):
    return ("apiVersion: v1\nkind: Config\nclusters:\n- name: standin\n  cluster:\n"
            "    server: %s\ncontexts:\n- name: standin\n  context:\n    cluster: standin\n"
            "    user: standin\n    namespace: default\ncurrent-context: standin\nusers:\n"
            "- name: standin\n  user: {}\n" % url)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT (port 0 = any free)")
    p.add_argument("--ready-file", help="written with the base URL once serving")
    p.add_argument("--state", help="JSON file that keeps objects across restarts")
    p.add_argument("--kubeconfig-out", help="write a kubeconfig for this server here")
    p.add_argument("--kubelet", action="store_true", help="run pods as local processes")
    p.add_argument("--kubelet-workdir", help="pod logs and emptyDirs (default: a temp dir)")
    p.add_argument("--kubelet-images", action="store_true",
                   help="run each container inside its image's root filesystem (chroot; "
                        "images from Buildah's local storage; needs root)")
    p.add_argument("--path-prepend", action="append", default=[],
                   help="directory put in front of PATH for pod processes (repeatable)")
    p.add_argument("--nodes", type=int, default=1, help="number of fake nodes")
    p.add_argument("--watch-history", type=int, default=1000,
                   help="events kept for watches from an older resourceVersion")
    p.add_argument("--bookmark-interval", type=float, default=5.0,
                   help="seconds between BOOKMARK events on watches that allow them")
    p.add_argument("--gc-delay", type=float, default=0.0,
                   help="seconds a dependent outlives its deleted owner before the garbage "
                        "collector deletes it (a real cluster's collector lags too)")
    p.add_argument("--node-capacity", default="",
                   help="allocatable resources of every node, e.g. cpu=4,memory=8Gi,nvidia.com/gpu=1 "
                        "(default cpu=64,memory=256Gi,pods=110); pods whose requests do not fit stay "
                        "Pending, Unschedulable")
    p.add_argument("--storage-class", action="append", default=None,
                   help="a storage class whose claims bind at once (repeatable; default: standard); "
                        "a claim of another class stays Pending, like one whose class does not exist")
    p.add_argument("--kueue-gate", action="store_true",
                   help="act as Kueue's webhook with nothing to admit: pods labelled "
                        "kueue.x-k8s.io/queue-name get its scheduling gate, which nothing removes")
    p.add_argument("--verbose", action="store_true", help="log every request")
    return p.parse_args(argv)


def build(args):
    reg = registrymod.Registry()
    st = storemod.Store(reg, args.state, args.watch_history)
    adm = admission.Admission(st, reg, storage_classes=args.storage_class or ["standard"],
                              kueue_gate=args.kueue_gate)
    adm.auth = authmod.Auth(st, reg)
    st.replay_load()                         # register CRDs kept in --state
    nsrt = reg.lookup("", "v1", "namespaces")
    for ns in SYSTEM_NAMESPACES:
        if st.find(nsrt, "", ns) is None:
            st.create(nsrt, "", {"metadata": {"name": ns}})
    collector = garbage.GarbageCollector(st, delay=args.gc_delay)
    kubelet = None
    if args.kubelet:
        import kubelet as kubeletmod
        kubelet = kubeletmod.Kubelet(st, reg, workdir=args.kubelet_workdir,
                                     path_prepend=args.path_prepend, nodes=args.nodes,
                                     images=args.kubelet_images,
                                     capacity=quantity.parse_resource_list(args.node_capacity, "--node-capacity"))
    host, port = args.listen.rsplit(":", 1)
    server = http_api.ApiServer((host, int(port)), st, reg, kubelet,
                                args.bookmark_interval, args.verbose, adm.auth)
    return st, collector, kubelet, server


def main(argv=None):
    args = parse_args(argv if argv is not None else sys.argv[1:])
    st, collector, kubelet, server = build(args)
    host, port = server.server_address[:2]
    url = "http://%s:%d" % (host, port)
    stop = threading.Event()

    def on_signal(signum, frame):
        stop.set()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    collector.start()
    if kubelet is not None:
        kubelet.api_url = url
        kubelet.start()
    serve = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                             name="http", daemon=True)
    serve.start()
    if args.kubeconfig_out:
        write_atomic(args.kubeconfig_out, kubeconfig(url))
    if args.ready_file:
        write_atomic(args.ready_file, url + "\n")
    print("apiserver stand-in serving on %s" % url, flush=True)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        server.stopping = True
        if kubelet is not None:
            kubelet.stop()
        collector.stop()
        st.close()
        server.shutdown()
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
