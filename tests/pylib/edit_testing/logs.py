"""The workers' machine-readable lines (runtime/src/bin/edit_train.cpp writes them to
stdout; edit-run --log-dir keeps one rank-<r>.log per rank, a pod's log holds them too):

    @edit {json}           every training.logEvery steps: step, loss, tokens, phase, ...
    @edit-summary {json}   once at the end of a run: rank, steps, val_loss, comm, ...

A rank that was replaced or restarted logs more than once into the same file; where one
value per rank is wanted, the last summary wins (the last incarnation's).
"""
import glob
import json
import os

PROGRESS = "@edit "
SUMMARY = "@edit-summary "


def parse(line):
    """("progress" | "summary", dict) for a protocol line, else None. A line cut short (a
    worker killed while writing it) is None too."""
    for kind, prefix in (("progress", PROGRESS), ("summary", SUMMARY)):
        if line.startswith(prefix):
            try:
                return kind, json.loads(line[len(prefix):])
            except ValueError:
                return None
    return None


def read(path):
    """(progress rows, summaries) of one log file, in file order."""
    rows, sums = [], []
    with open(path, errors="replace") as f:
        for line in f:
            p = parse(line)
            if p:
                (rows if p[0] == "progress" else sums).append(p[1])
    return rows, sums


def read_text(text):
    """(progress rows, summaries) of a log held in a string (kubectl logs)."""
    rows, sums = [], []
    for line in text.splitlines():
        p = parse(line)
        if p:
            (rows if p[0] == "progress" else sums).append(p[1])
    return rows, sums


def rank_logs(log_dir):
    """edit-run --log-dir's rank-<r>.log files, by rank."""
    return sorted(glob.glob(os.path.join(log_dir, "rank-*.log")),
                  key=lambda f: int(os.path.basename(f)[5:-4]))


def summaries(log_dir):
    """{rank: its last summary} of an edit-run --log-dir."""
    out = {}
    for f in rank_logs(log_dir):
        for s in read(f)[1]:
            out[s["rank"]] = s
    return out


def progress(log_dir, rank=0):
    """The progress rows of one rank of an edit-run --log-dir."""
    return read(os.path.join(log_dir, "rank-%d.log" % rank))[0]


def progress_by_rank(log_dir):
    """{rank: its progress rows} of an edit-run --log-dir."""
    out = {}
    for f in rank_logs(log_dir):
        for row in read(f)[0]:
            out.setdefault(row["rank"], []).append(row)
    return out


def furthest_step(log_dir):
    """The largest step any rank logged (0 when none did)."""
    return max((row["step"] for rows in progress_by_rank(log_dir).values() for row in rows), default=0)
