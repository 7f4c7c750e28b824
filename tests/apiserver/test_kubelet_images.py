"""The kubelet's image mode (--kubelet-images): containers run inside their image's root
filesystem with the pod's env, volumes, working directory and user. Uses the local
Debian base that scripts/build-images.sh makes (localhost/debian:bookworm, override with
STANDIN_TEST_IMAGE); every test skips (exit 77) when buildah or that image is missing,
or when not root.

Run:  PYTHONPATH=tests/pylib python3 tests/apiserver/test_kubelet_images.py -v
"""
import json
import os
import shutil
import tempfile
import unittest

from images import local_image_id as image_id
from standin_fixture import StandInCase

PODS = "/api/v1/namespaces/default/pods"
IMAGE = os.environ.get("STANDIN_TEST_IMAGE", "localhost/debian:bookworm")


def pod(name, command=None, policy="Never", image=IMAGE, **container):
    c = dict({"name": "main", "image": image}, **container)
    if command is not None:
        c["command"] = command
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"restartPolicy": policy, "containers": [c]}}


class ImageKubeletTest(StandInCase):
    extra_args = ("--kubelet", "--kubelet-images")

    @classmethod
    def setUpClass(cls):
        if os.geteuid() != 0:
            raise unittest.SkipTest("the image mode needs root")
        cls.image_id = image_id(IMAGE)
        if not cls.image_id:
            raise unittest.SkipTest("no image %s in Buildah's storage (scripts/build-images.sh makes it)" % IMAGE)
        super().setUpClass()

    def setUp(self):
        self.host = tempfile.mkdtemp(prefix="standin-images-host-")
        os.chmod(self.host, 0o755)          # readable by the container's user
        self.addCleanup(shutil.rmtree, self.host, True)

    def apply(self, obj):
        self.kubectl("apply", "-f", "-", input=json.dumps(obj))

    def get_pod(self, name):
        code, obj = self.s.api("GET", PODS + "/" + name)
        return obj if code == 200 else None

    def wait_phase(self, name, phase, timeout=30):
        return self.s.wait_for(lambda: (self.get_pod(name) or {}).get("status", {}).get(
            "phase") == phase and self.get_pod(name), timeout, what="%s %s" % (name, phase))

    def waiting(self, name, timeout=30):
        def fn():
            st = ((self.get_pod(name) or {}).get("status") or {}).get("containerStatuses") or [{}]
            return st[0].get("state", {}).get("waiting") if "reason" in st[0].get("state", {}).get(
                "waiting", {}) and st[0]["state"]["waiting"]["reason"] != "ContainerCreating" else None
        return self.s.wait_for(fn, timeout, what="%s waiting" % name)

    def test_env_volumes_workdir_and_user(self):
        with open(os.path.join(self.host, "in.txt"), "w") as f:
            f.write("from the host\n")
        marker = os.path.join(self.host, "in.txt")
        script = ("cat /etc/debian_version; id -u; id -g; id -G; pwd; echo $GREETING; cat /data/in.txt; "
                  "test -e %s && echo host-visible || echo host-hidden; "
                  "touch /data/x 2>/dev/null && echo data-rw || echo data-ro; "
                  "echo scratch > /scratch/out && cat /scratch/out; "
                  "touch /tmp/in-layer && echo layer-rw; touch /in-root 2>/dev/null || echo root-denied; "
                  "echo $HOME" % marker)
        p = pod("inimage", ["sh", "-c", script], workingDir="/work/here",
                env=[{"name": "GREETING", "value": "hello $(HOSTNAME)"}],
                volumeMounts=[{"name": "data", "mountPath": "/data", "readOnly": True},
                              {"name": "scratch", "mountPath": "/scratch"}],
                securityContext={"runAsUser": 1234, "runAsGroup": 2345})
        p["spec"]["securityContext"] = {"fsGroup": 3456}
        p["spec"]["volumes"] = [{"name": "data", "hostPath": {"path": self.host}},
                                {"name": "scratch", "emptyDir": {}}]
        self.apply(p)
        obj = self.wait_phase("inimage", "Succeeded")
        out = self.kubectl("logs", "inimage").stdout.splitlines()
        # host-hidden: the host's files are not there, only the image's and the volumes.
        self.assertEqual(out[0].split(".")[0], "12", out)
        self.assertEqual(out[1:5], ["1234", "2345", "2345 3456", "/work/here"], out)
        self.assertEqual(out[5:7], ["hello inimage", "from the host"], out)
        self.assertEqual(out[7:11], ["host-hidden", "data-ro", "scratch", "layer-rw"], out)
        self.assertEqual(out[11:13], ["root-denied", "/"], out)   # uid 1234 may not write /
        st = obj["status"]["containerStatuses"][0]
        self.assertEqual(st["imageID"], self.image_id)

    def test_process_root_is_the_image_and_deletion_stops_it(self):
        self.apply(pod("sleeper", ["sleep", "600"], securityContext={"runAsUser": 4321, "readOnlyRootFilesystem": True}))
        self.wait_phase("sleeper", "Running")
        code, procs = self.s.api("GET", "/standin/processes")
        pid = procs["default/sleeper"]["containers"]["main"]
        self.assertIsNotNone(pid, procs)
        # /proc/PID/root is the process's root as it sees it (its own mount namespace).
        self.assertNotEqual(os.readlink("/proc/%d/root" % pid), "/")
        self.assertTrue(os.path.isfile("/proc/%d/root/etc/debian_version" % pid))
        self.assertFalse(os.path.exists("/proc/%d/root%s" % (pid, self.host)))
        with open("/proc/%d/status" % pid) as f:
            uids = [l.split()[1:] for l in f if l.startswith("Uid:")][0]
        self.assertEqual(set(uids), {"4321"})
        with open("/proc/%d/cmdline" % pid) as f:
            self.assertEqual(f.read().split("\0")[0], "sleep")
        # readOnlyRootFilesystem: another container of the same spec cannot write /.
        self.apply(pod("rofs", ["sh", "-c", "touch /x 2>/dev/null && echo rw || echo ro"],
                       securityContext={"readOnlyRootFilesystem": True}))
        self.wait_phase("rofs", "Succeeded")
        self.assertEqual(self.kubectl("logs", "rofs").stdout, "ro\n")
        self.kubectl("delete", "pod", "sleeper", "--grace-period=1", "--wait=true", timeout=30)
        self.s.wait_for(lambda: not os.path.exists("/proc/%d" % pid), 10, what="pid %d gone" % pid)

    def test_image_entrypoint_cmd_rules(self):
        # No command and no args: the image's CMD (/bin/bash, stdin empty: exits 0).
        self.apply(pod("cmdonly"))
        self.wait_phase("cmdonly", "Succeeded")
        # args alone replace CMD: with no ENTRYPOINT, "-c" is the program: StartError.
        self.apply(pod("argsonly", args=["-c", "echo no"]))
        obj = self.wait_phase("argsonly", "Failed")
        term = obj["status"]["containerStatuses"][0]["state"]["terminated"]
        self.assertEqual(term["reason"], "StartError", term)
        self.assertIn("exec: -c: No such file or directory", term["message"])

    def test_run_as_non_root_refuses_a_root_image(self):
        p = pod("nonroot", ["true"])
        p["spec"]["securityContext"] = {"runAsNonRoot": True}
        self.apply(p)
        w = self.waiting("nonroot")
        self.assertEqual(w["reason"], "CreateContainerConfigError", w)
        self.assertIn("runAsNonRoot and image will run as root", w["message"])

    def test_missing_image_is_err_image_pull(self):
        self.apply(pod("noimage", ["true"], image="localhost/edit-no-such-image:0"))
        w = self.waiting("noimage")
        self.assertEqual(w["reason"], "ErrImagePull", w)
        self.assertIn("scripts/build-images.sh", w["message"])


if __name__ == "__main__":
    from edit_testing.unittest_main import main  # exits 77 (ctest: skipped) when every test skipped
    main()
