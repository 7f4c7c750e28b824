"""Placement of pending pods on the fake nodes: the pod's volume claims (found and
bound), resource requests against each node's allocatable, nodeSelector, required pod
(anti-)affinity on kubernetes.io/hostname, hostname topology spread, then round robin.
No taints or preferred terms are considered. Messages are worded as the real
scheduler's."""
import quantity
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


PREEMPTION = " preemption: 0/%d nodes are available: %d Preemption is not helpful for scheduling."


def _claims_problem(pod, find_claim):
    """Why the pod's PersistentVolumeClaims keep it off every node, or ""."""
    for v in (pod.get("spec") or {}).get("volumes") or []:
        name = (v.get("persistentVolumeClaim") or {}).get("claimName")
        if not name:
            continue
        claim = find_claim(name)
        if claim is None:
            return 'persistentvolumeclaim "%s" not found.' % name
        if (claim.get("status") or {}).get("phase") != "Bound":
            return "pod has unbound immediate PersistentVolumeClaims."
    return ""


def _fits(pod, node, pods):
    """The resources this node lacks for the pod (requests over allocatable minus what
    the pods bound to it request)."""
    want = quantity.pod_requests(pod)
    have = {}
    for k, v in ((node.get("status") or {}).get("allocatable") or {}).items():
        try:
            have[k] = quantity.parse(v)
        except ValueError:
            pass
    name = node["metadata"]["name"]
    for p in pods:
        if (p.get("spec") or {}).get("nodeName") == name and p["metadata"].get("uid") != pod["metadata"].get("uid"):
            for k, v in quantity.pod_requests(p).items():
                have[k] = have.get(k, 0.0) - v
    # Extended resources (nvidia.com/gpu) a node does not list it has none of.
    return [k for k, v in sorted(want.items())
            if v > 0 and (k in have or "/" in k) and v > have.get(k, 0.0) + 1e-9]


def choose_node(pod, nodes, pods, rr, find_claim=lambda name: None):
    """Return (node name or None, reason); rr is a round-robin counter; find_claim(name)
    reads a PersistentVolumeClaim of the pod's namespace (None when there is none)."""
    spec = pod.get("spec") or {}
    claims = _claims_problem(pod, find_claim)
    if claims:
        return None, "0/%d nodes are available: %s" % (len(nodes), claims) + PREEMPTION % (len(nodes), len(nodes))
    short = {}
    for n in nodes:
        for r in _fits(pod, n, pods):
            short[r] = short.get(r, 0) + 1
    fitting = [n for n in nodes if not _fits(pod, n, pods)]
    if not fitting:
        why = ", ".join("%d Insufficient %s" % (c, r) if r != "pods" else "%d Too many pods" % c
                        for r, c in sorted(short.items()))
        return None, "0/%d nodes are available: %s." % (len(nodes), why) + PREEMPTION % (len(nodes), len(nodes))
    nodes = fitting
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
