"""End-to-end in the runtime image: an EDiTJob whose worker pods run inside the built
localhost/edit-runtime image (the stand-in kubelet's image mode). ctest label image
(`make images`); skipped when the image is not built.

Run:  PYTHONPATH=tests/pylib python3 tests/e2e/test_image_runtime.py -v
"""
import os
import re
import time
import unittest

from edit_testing import logs as edit_logs
from edit_testing.ckpt import checkpoints
from edit_testing.cluster import Cluster, job_manifest, local_image_id, unique
from edit_testing.cpu import openblas_coretype
from edit_testing.data import make_data
from edit_testing.net import free_port
from edit_testing.paths import CRD, EDIT_DATA, OPERATOR, find_kubectl
from edit_testing.unittest_main import main


RUNTIME_IMAGE = os.environ.get("EDIT_RUNTIME_IMAGE", "localhost/edit-runtime:latest")


class ImageRuntime(unittest.TestCase):
    """The job's worker pods run inside the built runtime image (ctest label image): the
    stand-in's kubelet in image mode (--kubelet-images) runs each container's command in
    the image's root filesystem as the image's user, with the job's volumes bind-mounted
    (hostPath: the data read-only at /data, a checkpoint directory at /checkpoints). The
    operator is the host build. Skipped when the image is not built (make images)."""

    def test_job_in_runtime_image(self):
        STEPS = 60
        t0 = time.monotonic()
        if os.geteuid() != 0:
            self.skipTest("the kubelet's image mode needs root")
        image_id = local_image_id(RUNTIME_IMAGE)
        if not image_id:
            self.skipTest("image %s is not built (scripts/build-images.sh, or make images)" % RUNTIME_IMAGE)
        if not find_kubectl():
            self.skipTest("no kubectl (.tools/bin/kubectl; run scripts/install-deps.sh)")
        for binary in (OPERATOR, EDIT_DATA):
            if not os.access(binary, os.X_OK):
                self.skipTest("%s not built" % binary)
        # The host's edit-train must not be what runs: no --path-prepend of the build.
        self.c = Cluster(prefix="edit-e2e-img-", images=True)
        self.c.path_prepend = []
        self.addCleanup(self.c.close)
        self.c.start_standin()
        self.c.kubectl("apply", "-f", CRD)
        self.c.kubectl("wait", "--for=condition=Established", "crd/editjobs.edit.io", "--timeout=30s")
        ns, name = unique("e2e-img"), "tiny"
        self.c.create_namespace(ns)
        self.c.start_operator([ns])
        data, ckpt = os.path.join(self.c.tmp, "data"), os.path.join(self.c.tmp, "ckpt")
        os.makedirs(data)
        os.makedirs(ckpt)
        os.chmod(ckpt, 0o777)                 # the image's user (65532) writes checkpoints
        make_data(data)
        job = job_manifest(name, ns, "/data", "/checkpoints/" + name, free_port(), steps=STEPS, every=20)
        job["spec"]["image"] = RUNTIME_IMAGE
        job["spec"]["volumes"] = [{"name": "data", "hostPath": {"path": data}},
                                  {"name": "ckpt", "hostPath": {"path": ckpt}}]
        job["spec"]["volumeMounts"] = [{"name": "data", "mountPath": "/data", "readOnly": True},
                                       {"name": "ckpt", "mountPath": "/checkpoints"}]
        res = self.c.apply(job)
        self.assertIn("editjob.edit.io/%s created" % name, res.stdout)

        # While it runs: each worker's process has the image as its root and runs the
        # image's edit-train as uid 65532.
        pods = self.c.running_pods(ns, name, 4)
        procs = self.c.get("/standin/processes")
        checked = 0
        for p in pods:
            pid = procs["%s/%s" % (ns, p["metadata"]["name"])]["containers"]["worker"]
            if pid is None:
                continue                      # already finished
            try:
                exe = os.readlink("/proc/%d/exe" % pid)
                with open("/proc/%d/status" % pid) as f:
                    uid = [l.split()[1] for l in f if l.startswith("Uid:")][0]
            except OSError:
                continue                      # exited meanwhile
            # The image's /usr/local/bin/edit-train, seen through the pod's own overlay
            # (readlink shows the mount point as this process sees it).
            self.assertTrue(exe.startswith(os.path.join(self.c.tmp, "kubelet", "pods")) and
                            exe.endswith("/merged/usr/local/bin/edit-train"), exe)
            self.assertEqual(uid, "65532")
            self.assertTrue(os.path.exists("/proc/%d/root/usr/local/bin/edit-prepare-data" % pid))
            checked += 1
        self.assertGreater(checked, 0, "no worker process was still running to look at")

        w = self.c.kubectl("wait", "--for=condition=Succeeded", "ej/" + name, "-n", ns,
                           "--timeout=300s", check=False, timeout=320)
        self.assertEqual(w.returncode, 0, "kubectl wait failed: %s%s\n%s" % (w.stdout, w.stderr, self.c.diagnostics()))
        st = self.c.job(ns, name)["status"]
        self.assertEqual((st["phase"], st["progress"]["step"]), ("Succeeded", STEPS), st)
        for p in self.c.pods(ns, name):
            cs = p["status"]["containerStatuses"][0]
            self.assertEqual(cs["imageID"], image_id, cs)
            self.assertEqual(cs["state"]["terminated"]["exitCode"], 0, cs)
        # kubectl logs: the worker's own output, from inside the image.
        logs = self.c.kubectl("logs", "%s-worker-0" % name, "-n", ns).stdout
        # edit-train started alone (as in a pod) picks OpenBLAS's kernels for this CPU itself.
        kernels = re.findall(r"OpenBLAS kernels: (\S+)", logs)
        self.assertTrue(kernels, logs[-2000:])
        if openblas_coretype():
            self.assertEqual({k.lower() for k in kernels}, {openblas_coretype().lower()}, kernels)
        rows, summaries = edit_logs.read_text(logs)
        self.assertTrue(summaries, logs[-2000:])
        self.assertEqual(rows[-1]["step"], STEPS, rows[-1:])
        self.assertIn("checkpoint /checkpoints/tiny/step-%08d saved" % STEPS, logs)
        # The checkpoints the image's user wrote through the volume.
        done = checkpoints(os.path.join(ckpt, name))
        self.assertEqual([s for s, _ in done][-1:], [STEPS], done)
        self.assertEqual(os.stat(done[-1][1]).st_uid, 65532)
        summary = summaries[0]
        print("job in %s succeeded in %.1f s: 4 pods (2x2), %d steps, worker-0 validation loss %.4f, "
              "OpenBLAS kernels %s, checked %d live worker processes" % (
                  RUNTIME_IMAGE, time.monotonic() - t0, STEPS, summary["val_loss"], kernels[0], checked))


if __name__ == "__main__":
    main()
