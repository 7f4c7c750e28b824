"""JSON merge patch (RFC 7386), JSON patch (RFC 6902) and an approximation of
strategic merge patch (merge keys for the lists kubectl patches by name)."""
import copy

from errors import ApiError, bad_request

# Lists merged element-wise by a key in strategic merge patches; any other
# list is replaced, as in a merge patch.
MERGE_KEYS = {
    "containers": "name", "initContainers": "name", "ephemeralContainers": "name",
    "env": "name", "volumes": "name", "volumeMounts": "mountPath",
    "imagePullSecrets": "name", "conditions": "type", "ports": None,
    "hostAliases": "ip", "envFrom": None, "tolerations": None,
    "ownerReferences": "uid",
}


def merge_patch(target, patch):
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def _port_key(item):
    # Container ports merge on containerPort, service ports on port.
    return "containerPort" if "containerPort" in item else "port"


def strategic_merge(target, patch):
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    for k, v in patch.items():
        if k.startswith("$setElementOrder/") or k in ("$retainKeys", "$patch"):
            continue
        if k.startswith("$deleteFromPrimitiveList/"):
            field = k.split("/", 1)[1]
            out[field] = [x for x in out.get(field) or [] if x not in v]
            continue
        if v is None:
            out.pop(k, None)
        elif isinstance(v, list) and k in MERGE_KEYS and isinstance(out.get(k), list):
            out[k] = _merge_list(out[k], v, MERGE_KEYS[k])
        elif isinstance(v, list):
            out[k] = [_strip_directives(x) for x in v if not _is_delete(x)]
        else:
            out[k] = strategic_merge(out.get(k), v)
    return out


def _is_delete(x):
    return isinstance(x, dict) and x.get("$patch") == "delete"


def _strip_directives(x):
    if isinstance(x, dict):
        return {k: _strip_directives(v) for k, v in x.items() if not k.startswith("$")}
    return x


def _merge_list(current, patch_items, key):
    out = copy.deepcopy(current)
    for item in patch_items:
        if not isinstance(item, dict):
            if item not in out:
                out.append(item)
            continue
        k = key or _port_key(item)
        idx = next((i for i, c in enumerate(out)
                    if isinstance(c, dict) and c.get(k) == item.get(k)), None)
        if _is_delete(item):
            if idx is not None:
                out.pop(idx)
        elif idx is None:
            out.append(_strip_directives(item))
        else:
            out[idx] = strategic_merge(out[idx], item)
    return out


# ---- RFC 6902 ---------------------------------------------------------------
def _pointer(path):
    if path == "":
        return []
    if not path.startswith("/"):
        raise bad_request("invalid JSON pointer %r" % path)
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _walk(doc, parts):
    cur = doc
    for p in parts:
        if isinstance(cur, list):
            cur = cur[int(p)]
        elif isinstance(cur, dict):
            cur = cur[p]
        else:
            raise KeyError(p)
    return cur


def json_patch(doc, ops):
    doc = copy.deepcopy(doc)
    if not isinstance(ops, list):
        raise bad_request("json patch must be a list of operations")
    for op in ops:
        try:
            doc = _apply_op(doc, op)
        except ApiError:
            raise
        except (KeyError, IndexError, ValueError, TypeError) as e:
            raise ApiError(422, "Invalid", "the server rejected our request due to an error "
                           "in our request: %s %s: %r" % (op.get("op"), op.get("path"), e))
    return doc


def _apply_op(doc, op):
    kind, parts = op.get("op"), _pointer(op.get("path", ""))
    if kind == "test":
        if _walk(doc, parts) != op.get("value"):
            raise ApiError(422, "Invalid", "testing value %s failed" % op.get("path"))
        return doc
    if kind in ("move", "copy"):
        src = _pointer(op.get("from", ""))
        value = copy.deepcopy(_walk(doc, src))
        if kind == "move":
            doc = _remove(doc, src)
        return _add(doc, parts, value)
    if kind == "add":
        return _add(doc, parts, copy.deepcopy(op.get("value")))
    if kind == "remove":
        return _remove(doc, parts)
    if kind == "replace":
        _walk(doc, parts)                     # must exist
        if not parts:
            return copy.deepcopy(op.get("value"))
        parent = _walk(doc, parts[:-1])
        key = int(parts[-1]) if isinstance(parent, list) else parts[-1]
        parent[key] = copy.deepcopy(op.get("value"))
        return doc
    raise bad_request("unknown json patch operation %r" % kind)


def _add(doc, parts, value):
    if not parts:
        return value
    parent = _walk(doc, parts[:-1])
    last = parts[-1]
    if isinstance(parent, list):
        if last == "-":
            parent.append(value)
        else:
            i = int(last)
            if i > len(parent):
                raise IndexError(i)
            parent.insert(i, value)
    elif isinstance(parent, dict):
        parent[last] = value
    else:
        raise KeyError(last)
    return doc


def _remove(doc, parts):
    parent = _walk(doc, parts[:-1])
    last = parts[-1]
    if isinstance(parent, list):
        parent.pop(int(last))
    else:
        del parent[last]
    return doc
