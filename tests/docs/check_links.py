#!/usr/bin/env python3
"""Every relative link in the project's Markdown resolves: the file or folder exists, and
an #anchor names a heading of the linked page (GitHub's heading ids). Links with a scheme
(https:, mailto:) are not followed: the project cites only what it holds.

    python3 tests/docs/check_links.py [ROOT]
"""
import os
import re
import sys

SKIP_DIRS = {".git", ".tools", "node_modules"}


def heading_id(text):
    """GitHub's id of a heading: lower case, markup and punctuation dropped, spaces as '-'."""
    text = re.sub(r"[`*_]", "", text.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def markdown_files(root):
    for d, dirs, files in os.walk(root):
        # Build trees (build/, build-*/) hold copies and generated pages.
        dirs[:] = [x for x in dirs if x not in SKIP_DIRS and not x.startswith("build")]
        for f in files:
            if f.endswith(".md"):
                yield os.path.join(d, f)


def problems(root):
    out, ids = [], {}
    for f in sorted(markdown_files(root)):
        text = re.sub(r"```.*?```", "", open(f, errors="replace").read(), flags=re.S)
        for target in re.findall(r"\[[^\]]*\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):
                continue
            path, _, anchor = target.partition("#")
            full = os.path.normpath(os.path.join(os.path.dirname(f), path)) if path else f
            where = "%s: (%s)" % (os.path.relpath(f, root), target)
            if not os.path.exists(full):
                out.append(where + ": no such file")
            elif anchor and full.endswith(".md"):
                if full not in ids:
                    ids[full] = {heading_id(h) for h in re.findall(r"^#+ (.*)$", open(full).read(), re.M)}
                if anchor not in ids[full]:
                    out.append(where + ": no heading with that id")
    return out


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    bad = problems(root)
    for p in bad:
        print(p)
    print("links: %s" % ("%d broken" % len(bad) if bad else "ok"))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
