"""Placement of pending pods on the fake nodes: nodeSelector, required pod
(anti-)affinity on kubernetes.io/hostname, hostname topology spread, then
round robin. No resources, taints or preferred terms are considered."""
from selection import match_labels, selector_from_label_selector_obj

HOSTNAME = "kubernetes.io/hostname"


def _matching(term, pod, pods):
    """Pods (other than pod) selected by an affinity term, by node."""
    sel = selector_from_label_selector_obj(term.get("labelSelector")) or []
    namespaces = term.get("namespaces") or [pod["metadata"].get("namespace")]
    out = {}
    for p in pods:
        md = p["metadata"]
        if md.get("uid") == pod["metadata"].get("uid") or md.get("namespace") not in namespaces:
            continue
        if term.get("labelSelector") is not None and match_labels(sel, md.get("labels")):
            node = (p.get("spec") or {}).get("nodeName")
            if node:
                out[node] = out.get(node, 0) + 1
    return out


def _hostname_terms(affinity, key):
    required = ((affinity or {}).get(key) or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution") or []
    return [t for t in required if t.get("topologyKey") == HOSTNAME]


def choose_node(pod, nodes, pods, rr):
    """Return (node name or None, reason); rr is a round-robin counter."""
    spec = pod.get("spec") or {}
    want = spec.get("nodeSelector") or {}
    names = [n["metadata"]["name"] for n in nodes
             if all((n["metadata"].get("labels") or {}).get(k) == v for k, v in want.items())]
    if not names:
        return None, "0/%d nodes are available: node(s) didn't match Pod's node " \
                     "affinity/selector." % len(nodes)
    affinity = spec.get("affinity") or {}
    for term in _hostname_terms(affinity, "podAntiAffinity"):
        taken = _matching(term, pod, pods)
        names = [n for n in names if n not in taken]
    for term in _hostname_terms(affinity, "podAffinity"):
        present = _matching(term, pod, pods)
        if present:
            names = [n for n in names if n in present]
        else:
            # The first pod of a group may go anywhere if it matches itself.
            sel = selector_from_label_selector_obj(term.get("labelSelector")) or []
            if not match_labels(sel, pod["metadata"].get("labels")):
                names = []
    if not names:
        return None, "0/%d nodes are available: node(s) didn't match pod affinity/" \
                     "anti-affinity rules." % len(nodes)
    # Spread: prefer the nodes with the fewest pods of each spread constraint.
    for c in spec.get("topologySpreadConstraints") or []:
        if c.get("topologyKey") != HOSTNAME:
            continue
        counts = _matching({"labelSelector": c.get("labelSelector") or {}}, pod, pods)
        low = min(counts.get(n, 0) for n in names)
        if c.get("whenUnsatisfiable", "DoNotSchedule") == "DoNotSchedule":
            limit = low + int(c.get("maxSkew", 1)) - 1
            names = [n for n in names if counts.get(n, 0) <= limit]
        names = sorted(names, key=lambda n: counts.get(n, 0))
        names = [n for n in names if counts.get(n, 0) == counts.get(names[0], 0)]
    return names[rr % len(names)], ""
