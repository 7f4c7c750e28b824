"""The base of the e2e test cases (test_e2e.py, test_prometheus.py): each test gets its own
API stand-in with the CRD, and start_job applies the tiny EDiTJob of editjob-e2e.yaml in
a new namespace with an edit-operator watching it."""
import os
import unittest

from edit_testing.cluster import Cluster, unique
from edit_testing.data import make_data
from edit_testing.net import free_port
from edit_testing.paths import CRD, OPERATOR, find_kubectl

HERE = os.path.dirname(os.path.abspath(__file__))


def render_manifest(name, ns, data_dir, ckpt_dir, master_port, steps):
    """tests/e2e/editjob-e2e.yaml with its placeholders filled in."""
    with open(os.path.join(HERE, "editjob-e2e.yaml")) as f:
        text = f.read()
    for k, v in {"@NAME@": name, "@NAMESPACE@": ns, "@DATA@": data_dir, "@CKPT@": ckpt_dir,
                 "@MASTER_PORT@": str(master_port), "@STEPS@": str(steps)}.items():
        text = text.replace(k, v)
    return text


class Base(unittest.TestCase):
    """A fresh API stand-in with the CRD installed; start_job applies the tiny EDiTJob
    (editjob-e2e.yaml) in a new namespace, with an operator watching it."""
    standin_args = ()  # more stand-in flags, e.g. ("--gc-delay", "5")

    def setUp(self):
        if not find_kubectl():
            self.skipTest("no kubectl (.tools/bin/kubectl; run scripts/install-deps.sh)")
        if not os.access(OPERATOR, os.X_OK):
            self.skipTest("edit-operator not built: %s" % OPERATOR)
        self.c = Cluster(prefix="edit-e2e-", standin_args=self.standin_args)
        self.addCleanup(self.c.close)
        self.c.start_standin()
        self.c.kubectl("apply", "-f", CRD)
        self.c.kubectl("wait", "--for=condition=Established", "crd/editjobs.edit.io", "--timeout=30s")

    def start_job(self, steps, with_operator=True, extra_spec="", corrupt_train=False):
        self.ns = unique("e2e")
        self.name = "tiny"
        self.c.create_namespace(self.ns)
        if with_operator:
            self.c.start_operator([self.ns])
        data = os.path.join(self.c.tmp, "data")
        os.makedirs(data)
        make_data(data)
        if corrupt_train:  # a file the CRD and the operator cannot know is bad: edit-train exits 2
            path = os.path.join(data, "train.bin")
            os.truncate(path, os.path.getsize(path) - 1)  # llm.c header: more tokens than the file holds
        self.ckpt = os.path.join(self.c.tmp, "ckpt")
        # extra_spec: more spec fields, indented by 2 (the template's spec ends the file).
        manifest = render_manifest(self.name, self.ns, data, self.ckpt, free_port(), steps) + extra_spec
        self.manifest = manifest
        res = self.c.kubectl("apply", "-f", "-", input=manifest)
        self.assertIn("editjob.edit.io/%s created" % self.name, res.stdout)
