"""Kubernetes resource quantities ("500m", "2", "1Gi", "1.5G") as numbers, for the
scheduler's fit check and quota admission."""
import re

_SUFFIX = {"": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
           "Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40, "Pi": 2 ** 50, "Ei": 2 ** 60}
_QTY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")


def parse(value):
    """A quantity as a float; ValueError for anything else."""
    m = _QTY.match(str(value).strip())
    if not m:
        raise ValueError("quantities must match the regular expression "
                         "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$' (got %r)" % (value,))
    return float(m.group(1)) * _SUFFIX[m.group(2) or ""]


def parse_resource_list(text, flag):
    """"cpu=4,memory=8Gi" -> {"cpu": "4", "memory": "8Gi"} (checked)."""
    out = {}
    for item in filter(None, (t.strip() for t in (text or "").split(","))):
        name, _, value = item.partition("=")
        try:
            parse(value)
        except ValueError as e:
            raise SystemExit("%s: %s: %s" % (flag, item, e))
        out[name.strip()] = value.strip()
    return out


def show(name, value):
    """A quantity as the API server prints it in messages: cpu in millicores."""
    if name.endswith("cpu"):
        return "%dm" % round(value * 1000) if value != int(value) else "%d" % value
    return "%d" % value if value == int(value) else "%g" % value


def pod_requests(pod):
    """What a pod requests (the sum over its containers; limits stand in for absent
    requests, as defaulting does) plus pods=1."""
    total = {"pods": 1.0}
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        req = dict(res.get("limits") or {})
        req.update(res.get("requests") or {})
        for name, v in req.items():
            try:
                total[name] = total.get(name, 0.0) + parse(v)
            except ValueError:
                pass
    return total
