#!/usr/bin/env python3
"""Replica recovery: in place against a gang restart from a checkpoint.

Three runs of the same local EDiT training (edit-run, 2 replicas x 2 shards, the tiny
preset of examples/local/tiny.yaml), measured in one sitting so the ratios are comparable:

  undisturbed   no fault
  in-place      rank 3 is SIGKILLed at step --kill-at (debug.killAtStep); edit-run starts a
                replacement, the survivors re-form the groups with it and every replica
                continues from the last sync round (docs/replica-recovery.md)
  gang restart  the same kill with runtime.recovery=exit: every worker exits 75, and the run
                is started again and resumes from the newest checkpoint (what a launcher or
                the operator's gang restart does, minus pod scheduling)

Reported per faulted run: time lost (its wall time minus the undisturbed one), local steps
redone (the furthest step reached before the fault minus the step training resumed at),
and the final validation loss next to the undisturbed one. Writes recovery.md and
recovery.json to --out.

    python3 bench/recovery.py [--out bench/results/<date>] [--steps 160] [--kill-at 95]
"""
import argparse
import datetime
import json
import os
import shutil
import tempfile

from common import ROOT
from edit_testing import edit_run
from edit_testing.logs import furthest_step, summaries


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "runtime"))
    ap.add_argument("--config", default=os.path.join(ROOT, "examples", "local", "tiny.yaml"))
    ap.add_argument("--steps", type=int, default=160)
    ap.add_argument("--kill-at", type=int, default=95, help="step at which rank 3 is killed")
    ap.add_argument("--checkpoint-every", type=int, default=50)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", datetime.date.today().isoformat()))
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="edit-recovery-bench-")
    os.makedirs(a.out, exist_ok=True)

    def run(tag, sets, ckpt):
        base = [f"training.steps={a.steps}", f"checkpoint.dir={ckpt}",
                f"checkpoint.everySteps={a.checkpoint_every}", "runtime.collectiveTimeoutSeconds=60",
                "training.logEvery=1"]  # every step logged: the furthest step reached is exact
        p = edit_run.run(4, base + sets, shards=2, config=a.config, log_dir=os.path.join(work, "logs-" + tag),
                         quiet=True, binary=os.path.join(a.bin_dir, "edit-run"), cwd=ROOT, timeout=None)
        print(f"[recovery bench] {tag}: exit {p.returncode}, {p.wall:.1f} s", flush=True)
        return p, p.wall, p.log_dir

    kill = ["debug.killAtStep.rank=3", f"debug.killAtStep.step={a.kill_at}"]
    base, w0, logs0 = run("undisturbed", [], os.path.join(work, "ck-undisturbed"))
    assert base.returncode == 0, base.stderr[-2000:]
    loss0 = summaries(logs0)[0]["val_loss"]

    ip, w1, logs1 = run("in-place", kill, os.path.join(work, "ck-inplace"))
    assert ip.returncode == 0, ip.stderr[-2000:]
    s1 = summaries(logs1)
    survivors = [s for r, s in s1.items() if not s["joined"]]
    inplace = {
        "wall_seconds": w1, "time_lost_seconds": w1 - w0,
        "steps_redone": max(s["steps_rolled_back"] for s in survivors),
        "survivor_recovery_seconds": max(s["recovery_seconds"] for s in survivors),
        "checkpoint_read": any(s["resumed_from"] >= 0 for s in s1.values()),
        "val_loss": s1[0]["val_loss"],
    }

    ck = os.path.join(work, "ck-gang")
    g1, wa, logsa = run("gang restart: the faulted run", kill + ["runtime.recovery=exit"], ck)
    assert g1.returncode == 75, (g1.returncode, g1.stderr[-2000:])
    reached = furthest_step(logsa)
    g2, wb, logsb = run("gang restart: the resumed run", [], ck)
    assert g2.returncode == 0, g2.stderr[-2000:]
    s2 = summaries(logsb)
    resumed = s2[0]["resumed_from"]
    gang = {
        "wall_seconds": wa + wb, "time_lost_seconds": wa + wb - w0,
        "steps_redone": reached - resumed, "resumed_from_checkpoint": resumed,
        "val_loss": s2[0]["val_loss"],
    }
    res = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "steps": a.steps,
           "kill_at": a.kill_at, "checkpoint_every": a.checkpoint_every,
           "undisturbed": {"wall_seconds": w0, "val_loss": loss0}, "in_place": inplace, "gang_restart": gang}
    with open(os.path.join(a.out, "recovery.json"), "w") as f:
        json.dump(res, f, indent=2)
    with open(os.path.join(a.out, "recovery.md"), "w") as f:
        f.write(f"# Replica recovery: in place vs gang restart ({res['date']})\n\n")
        f.write(f"edit-run, 2 replicas x 2 shards, tiny preset, {a.steps} steps, syncInterval 16, "
                f"checkpoint every {a.checkpoint_every} steps; rank 3 SIGKILLed at step {a.kill_at}. "
                "One sitting, same machine (2 shared cores): compare the ratios, not the seconds.\n\n")
        f.write("| run | wall s | time lost s | steps redone | disk checkpoint read | val loss |\n|---|---|---|---|---|---|\n")
        f.write(f"| undisturbed | {w0:.1f} | - | - | no | {loss0:.4f} |\n")
        f.write(f"| in place | {w1:.1f} | {inplace['time_lost_seconds']:.1f} | {inplace['steps_redone']} | no | "
                f"{inplace['val_loss']:.4f} |\n")
        f.write(f"| gang restart | {wa + wb:.1f} | {gang['time_lost_seconds']:.1f} | {gang['steps_redone']} | "
                f"yes (step {resumed}) | {gang['val_loss']:.4f} |\n\n")
        ratio = gang["time_lost_seconds"] / max(1e-9, inplace["time_lost_seconds"])
        f.write(f"Gang restart loses {ratio:.1f}x the time of in-place recovery here; the survivors spent "
                f"{inplace['survivor_recovery_seconds']:.1f} s from noticing the lost peer to training again. "
                "On Kubernetes both add the replacement pod's scheduling and start; a gang restart also "
                "reschedules every pod of the job.\n")
    print(open(os.path.join(a.out, "recovery.md")).read())
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
