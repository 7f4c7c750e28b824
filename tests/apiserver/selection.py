"""Label and field selectors, parsed once per request and matched per object."""
import re

from errors import bad_request

_LABEL_REQ = re.compile(
    r"^\s*(?P<neg>!)?\s*(?P<key>[A-Za-z0-9_./-]+)\s*"
    r"(?:(?P<op>==|=|!=|\s+in\s+|\s+notin\s+)\s*(?P<val>.*?))?\s*$")


def _split_top(text):
    """Split on commas that are not inside parentheses (set-based values)."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return parts


def parse_label_selector(text):
    """Return a list of (key, op, values) requirements; empty matches all."""
    reqs = []
    for part in _split_top(text or ""):
        m = _LABEL_REQ.match(part)
        if not m:
            raise bad_request("unable to parse requirement: %r" % part)
        key, op, val = m.group("key"), (m.group("op") or "").strip(), m.group("val")
        if m.group("neg"):
            if op:
                raise bad_request("unable to parse requirement: %r" % part)
            reqs.append((key, "!exists", []))
        elif not op:
            reqs.append((key, "exists", []))
        elif op in ("in", "notin"):
            val = val.strip()
            if not (val.startswith("(") and val.endswith(")")):
                raise bad_request("unable to parse requirement: %r" % part)
            vals = [v.strip() for v in val[1:-1].split(",") if v.strip()]
            reqs.append((key, op, vals))
        else:
            reqs.append((key, "!=" if op == "!=" else "=", [val.strip()]))
    return reqs


def selector_from_label_selector_obj(sel):
    """Convert a metav1.LabelSelector object (matchLabels/matchExpressions)."""
    if sel is None:
        return None
    reqs = [(k, "=", [v]) for k, v in (sel.get("matchLabels") or {}).items()]
    ops = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!exists"}
    for expr in sel.get("matchExpressions") or []:
        reqs.append((expr.get("key"), ops.get(expr.get("operator"), "in"),
                     list(expr.get("values") or [])))
    return reqs


def match_labels(reqs, labels):
    labels = labels or {}
    for key, op, vals in reqs:
        present = key in labels
        value = labels.get(key)
        if op == "exists" and not present:
            return False
        if op == "!exists" and present:
            return False
        if op == "=" and value != vals[0]:
            return False
        if op == "!=" and present and value == vals[0]:
            return False
        if op == "in" and (not present or value not in vals):
            return False
        if op == "notin" and present and value in vals:
            return False
    return True


def parse_field_selector(text):
    """Return (path, op, value) triples; op is '=' or '!='."""
    reqs = []
    for part in _split_top(text or ""):
        part = part.strip()
        for op in ("!=", "==", "="):
            if op in part:
                path, value = part.split(op, 1)
                reqs.append((path.strip(), "!=" if op == "!=" else "=", value.strip()))
                break
        else:
            raise bad_request('invalid selector: %r; can\'t understand %r' % (text, part))
    return reqs


def field_value(obj, path):
    """Resolve a dotted field path; any field is allowed (the real server
    allows only a per-resource list)."""
    cur = obj
    for seg in path.split("."):
        if not isinstance(cur, dict):
            return ""
        cur = cur.get(seg)
    if cur is None:
        return ""
    if isinstance(cur, bool):
        return "true" if cur else "false"
    return str(cur)


def match_fields(reqs, obj):
    for path, op, value in reqs:
        actual = field_value(obj, path)
        if (actual == value) != (op == "="):
            return False
    return True
