"""One launcher for edit-run (the local launcher users run), and edit-train started alone
the way an operator-made pod starts it.

    p = edit_run.run(4, sets, shards=2, log_dir=logs)    # to the end
    p.returncode, p.stdout, p.stderr, p.wall; logs.summaries(p.log_dir)
    subprocess.Popen(edit_run.command(4, sets, log_dir=logs))   # to signal it meanwhile
"""
import os
import subprocess
import time

from . import paths


def command(nproc, sets=(), shards=None, log_dir=None, config=None, args=(), quiet=False, binary=None):
    """edit-run's argv: --nproc, [--shards], [--config], [--log-dir], [--quiet], `args`
    (more flags, e.g. --scale-at), then one --set per entry of `sets` (later ones win)."""
    cmd = [binary or paths.EDIT_RUN, "--nproc", str(nproc)]
    if shards:
        cmd += ["--shards", str(shards)]
    if config:
        cmd += ["--config", config]
    if log_dir:
        cmd += ["--log-dir", log_dir]
    if quiet:
        cmd.append("--quiet")
    cmd += list(args)
    for s in sets:
        cmd += ["--set", s]
    return cmd


def run(nproc, sets=(), shards=None, log_dir=None, config=None, args=(), quiet=False, binary=None,
        env=None, cwd=None, timeout=600, merge_output=False):
    """Runs edit-run to its end and returns the CompletedProcess (text output captured;
    merge_output: stderr into stdout), with .log_dir and .wall (seconds) added. `env`
    replaces the environment, as subprocess's does."""
    cmd = command(nproc, sets, shards, log_dir, config, args, quiet, binary)
    t0 = time.monotonic()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT if merge_output else subprocess.PIPE,
                       text=True, env=env, cwd=cwd, timeout=timeout)
    p.wall = time.monotonic() - t0
    p.log_dir = log_dir
    return p


def worker_env(rank, replicas, port, shards=1, master="127.0.0.1", bind="127.0.0.1", local_world=None):
    """The environment the operator gives rank `rank` of a replicas x shards job (what
    edit-run gives its workers too): rank, world, the rendezvous address, the layout, the
    address Gloo binds, and how many workers share the machine's cores."""
    world = replicas * shards
    return {"RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": master, "MASTER_PORT": str(port),
            "EDIT_REPLICAS": str(replicas), "EDIT_SHARDS": str(shards), "EDIT_BIND_ADDR": bind,
            "EDIT_LOCAL_WORLD_SIZE": str(local_world or world)}


def start_as_pod(test, args, log_path, rank, replicas, port, join, local_world, **env):
    """edit-train as an operator-made pod starts it (its environment, no edit-run): rank
    `rank` of `replicas` x 1, EDIT_JOIN `join` ("0", "1" or "scale"), output in log_path.
    `test` (a unittest.TestCase) kills it at its end if it still runs."""
    e = dict(os.environ, **worker_env(rank, replicas, port, local_world=local_world), EDIT_JOIN=join, **env)
    log = open(log_path, "w")
    test.addCleanup(log.close)
    p = subprocess.Popen(args, env=e, stdout=log, stderr=subprocess.STDOUT)
    test.addCleanup(lambda: p.poll() is None and p.kill())
    return p
