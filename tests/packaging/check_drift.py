#!/usr/bin/env python3
"""The chart carries no copy that can drift: its CRD, dashboards and alert rules are the
files of crds/, dashboards/ and deploy/prometheus/ (links into the chart), and the packaged
chart (helm package) holds exactly their content."""
import tarfile
import tempfile
from pathlib import Path

from common import ALERTS, CHART, CRD, DASHBOARDS, dashboard_files, fail, run, tool

def pairs():
    """{path inside the chart: its source file}."""
    out = {"crds/editjob.yaml": CRD, "files/edit-alerts.rules.yaml": ALERTS}
    for p in dashboard_files():
        out[f"files/dashboards/{p.name}"] = p
    return out


def main():
    problems = []
    sources = pairs()
    for rel, src in sources.items():
        path = CHART / rel
        if not path.exists():
            problems.append(f"charts/edit-operator/{rel} is missing (link it to {src})")
        elif path.read_bytes() != src.read_bytes():
            problems.append(f"charts/edit-operator/{rel} differs from {src}")
    chart_dash = sorted(p.name for p in (CHART / "files" / "dashboards").glob("*.json"))
    if chart_dash != sorted(p.name for p in DASHBOARDS.glob("*.json")):
        problems.append(f"chart dashboards {chart_dash} are not those of dashboards/")
    chart_crds = sorted(p.name for p in (CHART / "crds").iterdir())
    if chart_crds != ["editjob.yaml"]:
        problems.append(f"chart crds/ holds {chart_crds}")

    with tempfile.TemporaryDirectory() as tmp:
        run([tool("helm"), "package", CHART, "--destination", tmp])
        tgz = next(Path(tmp).glob("edit-operator-*.tgz"))
        with tarfile.open(tgz) as tar:
            members = {m.name.split("/", 1)[1]: m for m in tar.getmembers() if m.isfile()}
            for rel, src in sources.items():
                if rel not in members:
                    problems.append(f"packaged chart lacks {rel}")
                elif tar.extractfile(members[rel]).read() != src.read_bytes():
                    problems.append(f"packaged {rel} differs from {src}")
            for name in ("values.schema.json", "templates/NOTES.txt", "Chart.yaml", "values.yaml"):
                if name not in members:
                    problems.append(f"packaged chart lacks {name}")
    fail(problems, "drift")


if __name__ == "__main__":
    main()
