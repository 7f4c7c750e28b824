"""Local container images for the kubelet's image mode (--kubelet-images): an image
reference is looked up in Buildah's local storage (`buildah inspect`), never pulled, and
its root filesystem is made available read-only once per stand-in (`buildah from` +
`buildah mount`); each container then runs on its own overlay above it (chroot_exec.py).
"""
import json
import os
import random
import re
import shutil
import subprocess
import threading


def local_image_id(ref):
    """The image's ID in Buildah's local storage, None when it is not there or Buildah is
    missing (the tests of the image mode skip then)."""
    if not shutil.which("buildah"):
        return None
    res = subprocess.run(["buildah", "inspect", "--type", "image", "--format", "{{.FromImageID}}", ref],
                         capture_output=True, text=True)
    return res.stdout.strip() if res.returncode == 0 else None


class ImageError(Exception):
    """The image cannot be used (not in local storage, buildah missing): ErrImagePull."""


class Image:
    def __init__(self, ref, image_id, config, rootfs, container):
        self.ref, self.id, self.rootfs, self.container = ref, image_id, rootfs, container
        self.env = config.get("Env") or []
        self.entrypoint = config.get("Entrypoint") or []
        self.cmd = config.get("Cmd") or []
        self.workdir = config.get("WorkingDir") or "/"
        self.user = config.get("User") or ""

    def passwd(self, name_or_uid):
        """(uid, gid, home) of a user of the image's /etc/passwd, None if absent."""
        try:
            with open(os.path.join(self.rootfs, "etc", "passwd")) as f:
                for line in f:
                    parts = line.rstrip("\n").split(":")
                    if len(parts) >= 6 and name_or_uid in (parts[0], parts[2]):
                        return int(parts[2]), int(parts[3]), parts[5]
        except (OSError, ValueError):
            pass
        return None

    def group(self, name):
        try:
            with open(os.path.join(self.rootfs, "etc", "group")) as f:
                for line in f:
                    parts = line.split(":")
                    if len(parts) >= 3 and parts[0] == name:
                        return int(parts[2])
        except (OSError, ValueError):
            pass
        return None

    def default_user(self):
        """(uid, gid or None, home) from the image's USER (name or number, optional group)."""
        user, _, group = self.user.partition(":")
        uid, gid, home = 0, None, "/"
        if user:
            pw = self.passwd(user)
            if pw:
                uid, gid, home = pw
            elif user.isdigit():
                uid = int(user)
            else:
                raise ImageError("image %s: user %r is not in its /etc/passwd" % (self.ref, user))
        if group:
            gid = int(group) if group.isdigit() else self.group(group)
            if gid is None:
                raise ImageError("image %s: group %r is not in its /etc/group" % (self.ref, group))
        return uid, gid, home


class Images:
    """Images of local storage, each unpacked once (a Buildah working container named
    standin-<pid>-..., removed by close(); leftovers of dead stand-ins are swept)."""

    def __init__(self, buildah=None):
        self.buildah = buildah or shutil.which("buildah")
        self.lock = threading.Lock()
        self.cache = {}
        self._swept = False

    def _run(self, *args):
        if not self.buildah:
            raise ImageError("buildah is not installed (apt-get install buildah; "
                             "scripts/build-images.sh installs it)")
        return subprocess.run([self.buildah] + list(args), capture_output=True, text=True)

    def _sweep(self):
        """Removes working containers of stand-ins that no longer run."""
        res = self._run("containers", "--format", "{{.ContainerName}}")
        for name in res.stdout.split():
            m = re.fullmatch(r"standin-(\d+)-[0-9a-f]+", name)
            if m and int(m.group(1)) != os.getpid() and not os.path.exists("/proc/%s" % m.group(1)):
                self._run("rm", name)

    def get(self, ref):
        with self.lock:
            if ref in self.cache:
                return self.cache[ref]
            if not ref:
                raise ImageError("the container has no image")
            if not self._swept:
                self._swept = True
                self._sweep()
            res = self._run("inspect", "--type", "image", ref)
            if res.returncode != 0:
                raise ImageError("image %s is not in local storage (build it: scripts/build-images.sh): %s"
                                 % (ref, res.stderr.strip().splitlines()[-1:] or ""))
            info = json.loads(res.stdout)
            image_id = info.get("FromImageID") or ""
            config = (info.get("OCIv1") or {}).get("config") or {}
            name = "standin-%d-%04x%s" % (os.getpid(), random.randrange(1 << 16), image_id[:8])
            res = self._run("from", "--pull-never", "--name", name, ref)
            if res.returncode != 0:
                raise ImageError("buildah from %s: %s" % (ref, res.stderr.strip()))
            res = self._run("mount", name)
            if res.returncode != 0:
                self._run("rm", name)
                raise ImageError("buildah mount %s: %s" % (name, res.stderr.strip()))
            img = Image(ref, image_id, config, res.stdout.strip(), name)
            self.cache[ref] = img
            return img

    def close(self):
        with self.lock:
            for img in self.cache.values():
                self._run("rm", img.container)
            self.cache.clear()
