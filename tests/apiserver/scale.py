"""The scale subresource of custom resources: an autoscaling/v1 Scale read from, and
written to, the paths the CRD's subresources.scale declares (what kubectl scale and a
HorizontalPodAutoscaler use), as the apiextensions server does it."""
import errors


_JSON_TYPE = {str: "string", bool: "bool", list: "array", dict: "object"}


def _keys(path):
    return path.lstrip(".").split(".")


def _read(obj, path):
    for k in _keys(path):
        if not isinstance(obj, dict) or k not in obj:
            return None
        obj = obj[k]
    return obj


def of(rt, obj):
    """The Scale of a custom resource: spec.replicas is omitted when 0 (omitempty) and
    status.replicas is 0 when the object has none, as the real server renders them."""
    paths, md = rt.scale, obj["metadata"]
    scale = {"kind": "Scale", "apiVersion": "autoscaling/v1",
             "metadata": {k: md[k] for k in ("name", "namespace", "uid", "resourceVersion",
                                             "creationTimestamp") if k in md},
             "spec": {}, "status": {"replicas": _read(obj, paths["statusReplicasPath"]) or 0}}
    replicas = _read(obj, paths["specReplicasPath"])
    if replicas:
        scale["spec"]["replicas"] = replicas
    selector = _read(obj, paths["labelSelectorPath"]) if paths.get("labelSelectorPath") else None
    if selector:
        scale["status"]["selector"] = selector
    return scale


def apply(rt, obj, scale, name):
    """obj with the Scale's spec.replicas written at specReplicasPath. The Scale's
    resourceVersion becomes the object's, so that a stale one is a conflict; the caller
    then updates obj like any update of the main resource."""
    if not isinstance(scale, dict) or scale.get("kind", "Scale") != "Scale":
        raise errors.bad_request("wrong object passed to Scale update: %s" % str(scale)[:100])
    md = scale.get("metadata") or {}
    if md.get("name", name) != name:
        raise errors.bad_request("the name of the object (%s) does not match the name on "
                                 "the URL (%s)" % (md["name"], name))
    path = rt.scale["specReplicasPath"]
    replicas = (scale.get("spec") or {}).get("replicas")
    if replicas is None:
        if _read(obj, path) is None:
            raise errors.bad_request('the spec replicas field "%s" cannot be empty' % path)
        replicas = 0                        # omitempty: an absent value is 0
    if not isinstance(replicas, int) or isinstance(replicas, bool) or \
            not -2**31 <= replicas < 2**31:
        raise errors.bad_request("Scale in version \"v1\" cannot be handled as a Scale: "
                                 "json: cannot unmarshal %s into Go struct field "
                                 "ScaleSpec.spec.replicas of type int32" % _JSON_TYPE.get(
                                     type(replicas), "number"))
    node = obj
    for k in _keys(path)[:-1]:
        node = node.setdefault(k, {})
    node[_keys(path)[-1]] = replicas
    if md.get("resourceVersion"):
        obj["metadata"]["resourceVersion"] = md["resourceVersion"]
    return obj
