"""A marked block of /etc/hosts per stand-in instance, so pod and service
names resolve for real getaddrinfo. Written in place (the file is often a
bind mount that cannot be replaced) under an fcntl lock shared by all
instances; blocks of dead instances are swept."""
import fcntl
import os
import re
import sys

LOCK_PATH = "/tmp/edit-standin-hosts.lock"
_BLOCK = re.compile(r"# BEGIN edit-standin pid=(\d+)\n.*?# END edit-standin pid=\1\n", re.S)


def _alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


class HostsFile:
    def __init__(self, path="/etc/hosts"):
        self.path = path
        self.pid = os.getpid()
        self.enabled = True
        self.last = None

    def _rewrite(self, block):
        try:
            with open(LOCK_PATH, "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                with open(self.path, "r+") as f:
                    text = f.read()

                    def keep(m):
                        pid = int(m.group(1))
                        return "" if pid == self.pid or not _alive(pid) else m.group(0)
                    text = _BLOCK.sub(keep, text)
                    if text and not text.endswith("\n"):
                        text += "\n"
                    text += block
                    f.seek(0)
                    f.write(text)
                    f.truncate()
        except OSError as e:
            if self.enabled:
                print("kubelet: cannot update %s (%s); pod names will not resolve"
                      % (self.path, e), file=sys.stderr, flush=True)
            self.enabled = False

    def update(self, entries):
        """entries: list of (ip, [names]); unchanged content is not rewritten."""
        lines = ["%s %s\n" % (ip, " ".join(names)) for ip, names in entries if names]
        block = ""
        if lines:
            block = ("# BEGIN edit-standin pid=%d\n" % self.pid + "".join(lines) +
                     "# END edit-standin pid=%d\n" % self.pid)
        if block != self.last and self.enabled:
            self._rewrite(block)
            self.last = block

    def remove(self):
        if self.last:
            self._rewrite("")
            self.last = ""
