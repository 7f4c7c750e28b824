"""Container shim of the stand-in kubelet (process mode), in the role of containerd's shim.

    shim.py STATUS_BASE -- ARGV...

Runs ARGV as the container's process and records how it went in two files, each written
atomically: STATUS_BASE.pid (the container process, at start) and STATUS_BASE.exit
("exit N", "signal N", or "start-error MESSAGE"). The shim then ends the way its process
did, so the kubelet that started it reads the same status from the shim itself.

Why: the pods' processes run in their own sessions and outlive a stand-in that crashes
(SIGKILL), as containers outlive a real API server or kubelet restart. The restarted
kubelet adopts them, and since they are no longer its children it learns how they
ended from these files.

The kubelet signals the whole process group. The shim ignores the signals a container
acts on (its handlers are reset to the default in the container's process by exec) and
stays to record the end; SIGKILL and SIGSTOP reach both.
"""
import os
import signal
import subprocess
import sys


def write(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


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
