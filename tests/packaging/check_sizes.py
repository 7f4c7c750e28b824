#!/usr/bin/env python3
"""Production C++ stays readable: no source file over 600 lines, no function body over
100 lines (runtime/src, operator/src, common/src, the tools' mains).

A function is a brace opened at namespace or class level after a parenthesised header
(a definition, a constructor with its member initializers, an operator). Comments,
string and character literals (raw strings included) are blanked first, so braces in
them do not count. Lambdas and blocks inside a function count towards that function.

    python3 tests/packaging/check_sizes.py            # exit 1 naming every offender
    python3 tests/packaging/check_sizes.py --list 20  # the 20 longest functions
"""
import argparse
import os
import re
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DIRS = ["runtime/src", "operator/src", "common/src", "proto"]
MAX_FILE = 600
MAX_FUNCTION = 100


def blank_literals(text):
    """Comments and literals replaced by spaces, newlines kept (line numbers hold)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i)); i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j])); i = j
        elif c == "R" and text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'R"([^(\s]*)\(', text[i:])
            end = text.find(")" + m.group(1) + '"', i) if m else -1
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j])); i = j
        elif c in "\"'":
            if c == "'" and i > 0 and text[i - 1].isalnum():  # a digit separator: 1'000'000
                out.append(" "); i += 1; continue
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(re.sub(r"[^\n]", " ", text[i:j])); i = j
        else:
            out.append(c); i += 1
    return "".join(out)


def functions(text):
    """(name, first line, lines) of each function body in the text."""
    code = blank_literals(text)
    stack = []  # kinds of the open braces: ns, class, func, other
    header, parens, line, found = "", 0, 1, []
    start = {}
    for ch in code:
        if ch == "\n":
            line += 1
        if ch == "(":
            parens += 1
        elif ch == ")":
            parens = max(0, parens - 1)
        if ch == "{":
            outer = all(k in ("ns", "class") for k in stack)
            h = " ".join(header.split())
            if parens or not outer:
                kind = "other"
            elif re.search(r"\bnamespace\b|^extern\b", h):
                kind = "ns"
            elif re.search(r"\b(class|struct|union|enum)\b", h) and "(" not in h:
                kind = "class"
            elif "(" in h and not (re.search(r"(?<![=!<>])=(?!=)", h.split("(")[0]) and "operator" not in h):
                tail = h.rsplit(")", 1)[-1]
                qualifiers = re.fullmatch(r"(\s*(const|override|noexcept|final|mutable|&|&&))*\s*", tail)
                kind = "init" if re.search(r"\w\s*$", tail) and not qualifiers and "->" not in tail else "func"
            else:
                kind = "other"
            stack.append(kind)
            if kind == "func":
                start[len(stack)] = (line, h)
            if kind != "init":
                header = ""
            else:
                header += ch
            continue
        if ch == "}":
            kind = stack.pop() if stack else "other"
            if kind == "func":
                first, h = start.pop(len(stack) + 1)
                name = re.sub(r"\s*\(.*", "", h).split()[-1] if h.split() else "?"
                found.append((name, first, line - first + 1))
            if kind == "init":
                header += ch
            else:
                header = ""
            continue
        if ch == ";" and not parens:
            header = ""
            continue
        header += ch
    return found


def sources():
    for d in DIRS:
        for base, _, files in os.walk(os.path.join(ROOT, d)):
            for f in sorted(files):
                if f.endswith((".cpp", ".h", ".cc")) and "/gen/" not in base + "/":
                    yield os.path.join(base, f)


def main(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--list", type=int, default=0, help="print the N longest functions")
    a = p.parse_args(argv)
    bad, every = [], []
    for path in sources():
        rel = os.path.relpath(path, ROOT)
        text = open(path, encoding="utf-8").read()
        n = text.count("\n")
        if n > MAX_FILE:
            bad.append(f"{rel}: {n} lines (at most {MAX_FILE}: split it by what its parts do)")
        for name, first, length in functions(text):
            every.append((length, f"{rel}:{first} {name}"))
            if length > MAX_FUNCTION:
                bad.append(f"{rel}:{first}: function {name} is {length} lines (at most {MAX_FUNCTION}: "
                           "move a step into a named helper)")
    for length, where in sorted(every, reverse=True)[:a.list]:
        print(f"{length:5d}  {where}")
    if not every:
        print("check_sizes: found no functions (the scanner is broken)", file=sys.stderr)
        return 1
    for b in bad:
        print(b, file=sys.stderr)
    print(f"check_sizes: {len(every)} functions in {len(list(sources()))} files, {len(bad)} over the limits")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
