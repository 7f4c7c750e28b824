"""Fault suite, bad state: a corrupt newest checkpoint (skipped by its checksum) and a NaN in
one replica's weights (eliminated by the penalty) (fault_case.py has the common checks).

Run one case:  PYTHONPATH=tests/pylib python3 tests/faults/test_data_faults.py -v DataFaults.test_nan_in_one_replica
"""
import glob
import os

from fault_case import EVERY, SYNC, WORLD, FaultCase
from edit_testing.ckpt import checkpoints
from edit_testing.unittest_main import main


class DataFaults(FaultCase):
    def test_corrupt_newest_checkpoint(self):
        """Freeze the gang, flip bytes in one rank file of the newest complete checkpoint,
        kill a worker: the next generation skips the corrupt checkpoint (CRC mismatch) and
        resumes from the previous one. GangRestart: an in-place recovery reads no checkpoint."""
        self.start(replica_recovery="GangRestart")
        self.wait_checkpoint(24)
        for r in range(WORLD):
            self.c.kill(self.ns, self.pod(r), "STOP")
        newest, path = checkpoints(self.ckpt)[-1]
        prev = [s for s, _ in checkpoints(self.ckpt) if s < newest][-1]
        f = os.path.join(path, "rank-00002.ckpt")
        with open(f, "r+b") as fh:
            fh.seek(os.path.getsize(f) // 2)
            b = fh.read(16)
            fh.seek(os.path.getsize(f) // 2)
            fh.write(bytes(x ^ 0xFF for x in b))
        self.c.kill(self.ns, self.pod(1), "KILL")
        for r in (0, 2, 3):
            self.c.kill(self.ns, self.pod(r), "CONT")
        self.finish(expect_restarts=1, redo_bound=2 * EVERY + SYNC)
        self.assertEqual(self.resumed_from(1), prev, "generation 1 should resume from %d (newest %d corrupt)" % (prev, newest))
        logs = "".join(open(f, errors="replace").read() for f in glob.glob(
            os.path.join(self.c.tmp, "kubelet", "pods", "*", "worker.log")))
        self.assertRegex(logs, r"skipping checkpoint.*checksum|checksum mismatch")

    def test_nan_in_one_replica(self):
        """debug.corruptReplica writes a NaN into replica 1's weights before sync 4: the
        penalty treats the non-finite pseudo-gradient as an anomaly, the job succeeds and
        the final weights are finite."""
        self.start(debug={"corruptReplica": {"replica": 1, "atSync": 4, "nan": True}})
        self.finish(expect_restarts=0)
        sums = self.c.summaries(self.ns, self.name)
        anomalies = {r: ss[-1]["anomalies"] for r, ss in sums.items()}
        self.assertGreater(max(anomalies.values()), 0, anomalies)


if __name__ == "__main__":
    main()
