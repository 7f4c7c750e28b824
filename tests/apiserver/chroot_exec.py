#!/usr/bin/env python3
"""Starts one container process of the stand-in kubelet's image mode (--kubelet-images).

    python3 -I chroot_exec.py SPEC_JSON

Runs as root, in the kubelet's process group slot: it makes a private mount namespace,
mounts a fresh writable overlay over the image's root filesystem (the container's own
layer, as a container runtime does), mounts /proc, /dev, /sys, the host's /etc/hosts
(the stand-in's DNS names) and the pod's volumes, then chroots, switches to the
container's user and execs the command, keeping its PID (the kubelet signals it).
There are no PID, network or user namespaces and no cgroups: pods share the host's
network (their 127.x addresses), as in the host-process mode.

SPEC_JSON: {"rootfs", "layer", "workdir", "uid", "gid", "groups", "readOnlyRoot",
"binds": [[host path, container path, read-only]], "argv", "statusFd"}. The environment
is the container's. A failure before the exec is written to statusFd (closed unwritten
on a successful exec) so that the kubelet reports StartError, as for a host process.
Python standard library only (ctypes for mount/unshare).
"""
import ctypes
import errno
import json
import os
import sys

CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18

_libc = ctypes.CDLL(None, use_errno=True)


def _enc(s):
    return s.encode() if s is not None else None


def mount(src, target, fstype, flags, data=None):
    if _libc.mount(_enc(src), _enc(target), _enc(fstype), ctypes.c_ulong(flags), _enc(data)) != 0:
        e = ctypes.get_errno()
        raise OSError(e, "mount %s on %s: %s" % (src or fstype or "", target, os.strerror(e)))


def inside(root, path):
    """path (absolute, in the container) under root, following symbolic links as the
    container would see them: never outside root."""
    parts = [p for p in path.split("/") if p and p != "."]
    cur, hops = [], 0
    while parts:
        p = parts.pop(0)
        if p == "..":
            if cur:
                cur.pop()
            continue
        host = os.path.join(root, *cur, p)
        if os.path.islink(host):
            hops += 1
            if hops > 40:
                raise OSError(errno.ELOOP, "too many links in %s" % path)
            target = os.readlink(host)
            if target.startswith("/"):
                cur = []
            parts = [q for q in target.split("/") if q and q != "."] + parts
            continue
        cur.append(p)
    return os.path.join(root, *cur)


def mountpoint(root, path, like):
    """Creates the mount point for `like` (a directory or a file) inside the container."""
    target = inside(root, path)
    if os.path.isdir(like):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if not os.path.exists(target):
            open(target, "a").close()
    return target


def setup(spec):
    """Everything up to the exec; returns the container's root."""
    if _libc.unshare(CLONE_NEWNS) != 0:
        e = ctypes.get_errno()
        raise OSError(e, "unshare(CLONE_NEWNS): %s (the image mode needs root)" % os.strerror(e))
    mount(None, "/", None, MS_REC | MS_PRIVATE)       # nothing leaks back to the host
    layer = spec["layer"]
    upper, work, root = (os.path.join(layer, d) for d in ("upper", "work", "merged"))
    for d in (upper, work, root):
        os.makedirs(d, exist_ok=True)
    mount("overlay", root, "overlay", 0,
          "lowerdir=%s,upperdir=%s,workdir=%s" % (spec["rootfs"], upper, work))
    mount("proc", mountpoint(root, "/proc", "/proc"), "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for src in ("/dev", "/sys"):
        mount(src, mountpoint(root, src, src), None, MS_BIND | MS_REC)
    # The kubelet manages /etc/hosts in a real pod too; here it is the host's, which holds
    # the stand-in's names (updated in place, so a bind mount sees every change).
    for src in ("/etc/hosts", "/etc/resolv.conf"):
        if os.path.exists(src):
            mount(src, mountpoint(root, src, src), None, MS_BIND)
    for src, dst, ro in spec.get("binds") or []:
        if not os.path.exists(src):
            raise OSError(errno.ENOENT, "volume source %s (for %s) does not exist" % (src, dst))
        target = mountpoint(root, dst, src)
        mount(src, target, None, MS_BIND | MS_REC)
        if ro:
            mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY)
    workdir = spec.get("workdir") or "/"
    os.makedirs(inside(root, workdir), exist_ok=True)   # as runtimes do for a missing one
    if spec.get("readOnlyRoot"):
        mount(None, root, None, MS_REMOUNT | MS_BIND | MS_RDONLY)
    return root, workdir


def main():
    spec = json.loads(sys.argv[1])
    status = spec.get("statusFd")
    argv = spec["argv"]
    phase = "setup"
    try:
        root, workdir = setup(spec)
        os.chroot(root)
        os.chdir(workdir)
        os.setgroups(spec.get("groups") or [])
        os.setgid(spec.get("gid", 0))
        os.setuid(spec.get("uid", 0))
        if status is not None:
            os.set_inheritable(status, False)           # closed by a successful exec
        phase = "exec"
        os.execvpe(argv[0], argv, os.environ)
    except OSError as e:
        msg = "exec: %s: %s" % (argv[0], e.strerror) if phase == "exec" else \
            "%s%s" % (e.strerror or e, ": %s" % e.filename if e.filename else "")
        if status is not None:
            os.write(status, msg.encode())
        print("chroot_exec: %s" % msg, file=sys.stderr, flush=True)
        os._exit(128)


if __name__ == "__main__":
    main()
