"""Decoding of the Kubernetes protobuf envelope for the few kinds that
`kubectl create <generator>` sends as protobuf (Namespace, ConfigMap, Secret,
ServiceAccount; TokenRequest for `kubectl create token`). Everything else must be JSON."""
import base64

MAGIC = b"k8s\x00"


def _varint(buf, i):
    shift = result = 0
    while True:
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, i
        shift += 7


def fields(buf):
    """Yield (field number, wire type, value) of one message."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            val, i = _varint(buf, i)
        elif wire == 2:
            n, i = _varint(buf, i)
            val, i = buf[i:i + n], i + n
        elif wire == 1:
            val, i = buf[i:i + 8], i + 8
        elif wire == 5:
            val, i = buf[i:i + 4], i + 4
        else:
            raise ValueError("unsupported wire type %d" % wire)
        yield num, wire, val


def _map_entry(buf, binary=False):
    k = v = b""
    for num, _, val in fields(buf):
        if num == 1:
            k = val
        elif num == 2:
            v = val
    return k.decode(), (base64.b64encode(v).decode() if binary else v.decode())


def _owner_ref(buf):
    names = {1: "kind", 3: "name", 4: "uid", 5: "apiVersion"}
    out = {}
    for num, _, val in fields(buf):
        if num in names:
            out[names[num]] = val.decode()
        elif num == 6:
            out["controller"] = bool(val)
        elif num == 7:
            out["blockOwnerDeletion"] = bool(val)
    return out


def _object_meta(buf):
    strings = {1: "name", 2: "generateName", 3: "namespace", 5: "uid", 6: "resourceVersion"}
    md = {}
    for num, _, val in fields(buf):
        if num in strings:
            if val:                          # proto2 sends empty optional strings
                md[strings[num]] = val.decode()
        elif num in (11, 12):
            k, v = _map_entry(val)
            md.setdefault("labels" if num == 11 else "annotations", {})[k] = v
        elif num == 13:
            md.setdefault("ownerReferences", []).append(_owner_ref(val))
        elif num == 14:
            md.setdefault("finalizers", []).append(val.decode())
    return md


def _configmap(buf):
    obj = {}
    for num, _, val in fields(buf):
        if num == 1:
            obj["metadata"] = _object_meta(val)
        elif num in (2, 3):
            k, v = _map_entry(val, binary=num == 3)
            obj.setdefault("data" if num == 2 else "binaryData", {})[k] = v
        elif num == 4:
            obj["immutable"] = bool(val)
    return obj


def _secret(buf):
    obj = {}
    for num, _, val in fields(buf):
        if num == 1:
            obj["metadata"] = _object_meta(val)
        elif num in (2, 4):
            k, v = _map_entry(val, binary=num == 2)
            obj.setdefault("data" if num == 2 else "stringData", {})[k] = v
        elif num == 3 and val:
            obj["type"] = val.decode()
        elif num == 5:
            obj["immutable"] = bool(val)
    return obj


def _namespace(buf):
    obj = {}
    for num, _, val in fields(buf):
        if num == 1:
            obj["metadata"] = _object_meta(val)
        elif num == 2:
            fins = [v.decode() for n, _, v in fields(val) if n == 1]
            obj["spec"] = {"finalizers": fins} if fins else {}
    return obj


def _service_account(buf):
    obj = {}
    for num, _, val in fields(buf):
        if num == 1:
            obj["metadata"] = _object_meta(val)
        elif num == 4:
            obj["automountServiceAccountToken"] = bool(val)
    return obj


def _token_request(buf):
    """authentication.k8s.io/v1 TokenRequest: spec.audiences (1), expirationSeconds (4)."""
    obj = {"spec": {}}
    for num, _, val in fields(buf):
        if num == 1:
            obj["metadata"] = _object_meta(val)
        elif num == 2:
            for n, _, v in fields(val):
                if n == 1:
                    obj["spec"].setdefault("audiences", []).append(v.decode())
                elif n == 4:
                    obj["spec"]["expirationSeconds"] = v
    return obj


DECODERS = {("v1", "ConfigMap"): _configmap, ("v1", "Secret"): _secret,
            ("v1", "Namespace"): _namespace, ("v1", "ServiceAccount"): _service_account,
            ("authentication.k8s.io/v1", "TokenRequest"): _token_request}


def decode(body):
    """Return the JSON form of a protobuf-encoded object, or raise ValueError."""
    if not body.startswith(MAGIC):
        raise ValueError("missing protobuf envelope")
    api_version = kind = ""
    raw = b""
    for num, _, val in fields(body[len(MAGIC):]):
        if num == 1:
            for n, _, v in fields(val):
                if n == 1:
                    api_version = v.decode()
                elif n == 2:
                    kind = v.decode()
        elif num == 2:
            raw = val
    decoder = DECODERS.get((api_version, kind))
    if decoder is None:
        raise ValueError("protobuf is decoded only for %s"
                         % ", ".join(k for _, k in DECODERS))
    obj = decoder(raw)
    obj["apiVersion"], obj["kind"] = api_version, kind
    return obj
