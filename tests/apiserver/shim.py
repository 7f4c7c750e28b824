"""Container shim of the stand-in kubelet (process mode), in the role of containerd's shim.

    shim.py STATUS_BASE -- ARGV...

Runs ARGV as the container's process and records how it went in two files, each written
atomically: STATUS_BASE.pid (the container process, at start) and STATUS_BASE.exit
("exit N", "signal N", or "start-error MESSAGE"). The shim then ends the way its process
did, so the kubelet that started it reads the same status from the shim itself.

Why: the pods' processes run in their own sessions and outlive a stand-in that crashes
(SIGKILL), as containers outlive a real API server or kubelet restart. The restarted
kubelet adopts them, and since they are no longer its children it learns how they
ended from these files (read_exit, AdoptedProcess below: the file format lives here
only).

The kubelet signals the whole process group. The shim ignores the signals a container
acts on (its handlers are reset to the default in the container's process by exec) and
stays to record the end; SIGKILL and SIGSTOP reach both.
"""
import os
import signal
import subprocess
import sys
import time


def write(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


# ---- the kubelet's side: what a shim wrote, and a process adopted from an earlier kubelet

def read_exit(base):
    """The shim's record of how its process ended: a Popen-style returncode (negative: the
    signal) and a start error message, or None while it runs."""
    try:
        with open(base + ".exit") as f:
            kind, _, value = f.read().partition(" ")
    except OSError:
        return None
    if kind == "signal":
        return -int(value), None
    if kind == "start-error":
        return 128, value
    return int(value), None


def read_pid(base):
    """The container process the shim started, or None before it started."""
    try:
        with open(base + ".pid") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def alive(pid, base):
    """The shim `pid` still runs (and is the shim of `base`, not a reused pid)."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return (base + "\0").encode() in f.read()
    except OSError:
        return False


class AdoptedProcess:
    """A container process started by an earlier kubelet, whose shim outlived it. It is not
    this process's child: its end is read from the shim's status file."""

    def __init__(self, pid, base):
        self.pid, self.base = pid, base
        self.returncode = None

    def poll(self):
        if self.returncode is None:
            status = read_exit(self.base)
            if status is None and not alive(self.pid, self.base):
                # Gone: read again (it may have written the file and exited meanwhile),
                # else it was killed with its shim (SIGKILL to the group).
                status = read_exit(self.base) or (-signal.SIGKILL, None)
            if status is not None:
                self.returncode = status[0]
        return self.returncode

    def wait(self, timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired("adopted pid %d" % self.pid, timeout)
            time.sleep(0.05)
        return self.returncode


# ---- the shim


def main():
    if len(sys.argv) < 4 or sys.argv[2] != "--":
        sys.exit("usage: shim.py STATUS_BASE -- ARGV...")
    base, argv = sys.argv[1], sys.argv[3:]
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT,
                signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, lambda *_: None)
    try:
        proc = subprocess.Popen(argv)
    except OSError as e:
        write(base + ".exit", "start-error exec: %s: %s" % (argv[0], e.strerror))
        sys.exit(128)
    write(base + ".pid", "%d\n" % proc.pid)
    code = proc.wait()
    if code < 0:
        write(base + ".exit", "signal %d" % -code)
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        sys.exit(128 - code)             # a signal whose default is not to terminate
    write(base + ".exit", "exit %d" % code)
    sys.exit(code)


if __name__ == "__main__":
    main()
