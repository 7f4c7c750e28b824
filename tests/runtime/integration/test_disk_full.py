"""A full disk during a checkpoint, on a small tmpfs as checkpoint.dir (root only: the
test mounts it, and skips where mounting is not permitted).

A first run leaves a checkpoint at step 8; the tmpfs is then shrunk to hold it and half
of another, and a second run resumes and reaches the checkpoint of step 16, which cannot
fit. Checked as a user (and the operator, which reads the exit code) would: every worker
exits 4 (kExitNoSpace, permanent: no replacement, no retry) together, the message names
the directory and ENOSPC, no temporary or partial file is left, the checkpoint of step 8
still verifies, and once space is freed a rerun resumes from it and finishes.
"""
import glob
import os
import subprocess
import unittest

import test_edit_run as base  # the mode tests' temp dir, corpus and tiny schedule
from edit_testing import ckpt, edit_run
from edit_testing.logs import summaries

EXIT_NO_SPACE = 4  # common/src/exit_codes.h


def mount_tmpfs(path, size):
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return r.returncode == 0, r.stdout.strip()


def dir_bytes(path):
    return sum(os.path.getsize(f) for f in glob.glob(os.path.join(path, "**"), recursive=True) if os.path.isfile(f))


class DiskFull(unittest.TestCase):
    setUp = base.EditRun.setUp
    base_sets = base.EditRun.base_sets

    def tearDown(self):
        if getattr(self, "mounted", None):
            subprocess.run(["umount", self.mounted], check=False)
        base.EditRun.tearDown(self)

    def run_job(self, steps, tag):
        sets = self.base_sets() + ["algorithm.mode=edit", f"training.steps={steps}", "checkpoint.everySteps=8",
                                   "checkpoint.keep=1", f"checkpoint.dir={self.ck}"]
        return edit_run.run(2, sets, log_dir=os.path.join(self.d, "logs-" + tag))

    def test_full_disk_fails_every_worker_with_enospc_and_keeps_the_previous_checkpoint(self):
        if os.geteuid() != 0:
            self.skipTest("not root: the test mounts a tmpfs as checkpoint.dir")
        self.ck = os.path.join(self.d, "ckpt-tmpfs")
        os.makedirs(self.ck)
        ok, why = mount_tmpfs(self.ck, "64m")
        if not ok:
            self.skipTest(f"mounting a tmpfs is not permitted here: {why}")
        self.mounted = self.ck

        first = self.run_job(8, "first")
        self.assertEqual(first.returncode, 0, first.stdout[-2000:] + first.stderr[-2000:])
        self.assertEqual([s for s, _ in ckpt.checkpoints(self.ck)], [8])
        size = dir_bytes(self.ck)
        # Room for the checkpoint of step 8 and half of the next (tmpfs counts whole pages).
        r = subprocess.run(["mount", "-o", f"remount,size={size + size // 2}", self.ck],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.assertEqual(r.returncode, 0, r.stdout)

        full = self.run_job(24, "full")
        out = full.stdout[-4000:] + full.stderr[-4000:]
        self.assertEqual(full.returncode, EXIT_NO_SPACE, out)
        # Permanent: edit-run replaced nobody (an in-place recovery would fail at the same
        # checkpoint and spend the job's retries on it).
        self.assertNotIn("starting a replacement", full.stderr)
        step16 = os.path.join(self.ck, "step-00000016")
        for r in range(2):
            with open(os.path.join(self.d, "logs-full", f"rank-{r}.log"), errors="replace") as f:
                text = f.read()
            self.assertIn(f"checkpoint {step16} was not saved: ENOSPC", text, f"rank {r}:\n{text[-2000:]}")
            self.assertIn(f"Free space in {self.ck}", text)
            self.assertIn("step-00000008, is intact", text)
        # Nothing of step 16 is left, no temporary file anywhere; step 8 verifies.
        left = [os.path.relpath(p, self.ck) for p in glob.glob(os.path.join(self.ck, "**"), recursive=True)
                if p != self.ck + "/"]
        self.assertEqual(sorted(left), ["step-00000008", "step-00000008/MANIFEST", "step-00000008/rank-00000.ckpt",
                                        "step-00000008/rank-00001.ckpt"], left)
        step8 = os.path.join(self.ck, "step-00000008")
        for r in range(2):
            ckpt.read(os.path.join(step8, f"rank-{r:05d}.ckpt"))  # checks its CRC

        # Space freed: the job runs again from step 8 and finishes.
        subprocess.run(["mount", "-o", "remount,size=64m", self.ck], check=True)
        again = self.run_job(24, "again")
        self.assertEqual(again.returncode, 0, again.stdout[-2000:] + again.stderr[-2000:])
        s = summaries(os.path.join(self.d, "logs-again"))
        self.assertEqual([s[r]["resumed_from"] for r in range(2)], [8, 8])
        self.assertEqual(s[0]["steps"], 24)


if __name__ == "__main__":
    from edit_testing.unittest_main import main  # exits 77 (ctest: skipped) when every test skipped
    main()
