"""Where things are: the source tree, the build (EDIT_BUILD_DIR, default build/), its
binaries, the API stand-in and the CRD."""
import os
import shutil

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
BUILD = os.environ.get("EDIT_BUILD_DIR", os.path.join(ROOT, "build"))
RUNTIME_DIR = os.path.join(BUILD, "runtime")
EDIT_RUN = os.path.join(RUNTIME_DIR, "edit-run")
EDIT_TRAIN = os.path.join(RUNTIME_DIR, "edit-train")
EDIT_DATA = os.path.join(RUNTIME_DIR, "edit-data")
EDIT_EXPORT = os.path.join(RUNTIME_DIR, "edit-export")
OPERATOR = os.environ.get("EDIT_OPERATOR", os.path.join(BUILD, "operator", "edit-operator"))
STANDIN = os.path.join(ROOT, "tests", "apiserver", "standin.py")
CRD = os.path.join(ROOT, "crds", "editjob.yaml")


def find_kubectl():
    """$KUBECTL, .tools/bin/kubectl (scripts/install-deps.sh), /usr/bin/kubectl or PATH's."""
    for cand in (os.environ.get("KUBECTL"), os.path.join(ROOT, ".tools", "bin", "kubectl"),
                 "/usr/bin/kubectl", shutil.which("kubectl")):
        if cand and os.access(cand, os.X_OK):
            return cand
    return None
