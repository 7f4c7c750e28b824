"""OpenAPI v3 documents: an index and one document per group/version.

Custom resources get their CRD schema (so `kubectl explain` prints its
descriptions); built-in kinds get minimal schemas. Every write operation
lists the fieldValidation parameter so kubectl leaves validation to us.
"""
import copy
import hashlib
import json

OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"

_META_SCHEMA = {
    "type": "object",
    "description": "ObjectMeta is metadata that all persisted resources must have, which "
                   "includes all objects users must create.",
    "properties": {
        "name": {"type": "string", "description": "Name must be unique within a namespace."},
        "generateName": {"type": "string", "description": "Optional prefix used by the "
                         "server to generate a unique name."},
        "namespace": {"type": "string", "description": "Namespace defines the space within "
                      "which each name must be unique."},
        "labels": {"type": "object", "additionalProperties": {"type": "string"},
                   "description": "Map of string keys and values that can be used to "
                                  "organize and categorize objects."},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"},
                        "description": "Annotations is an unstructured key value map."},
        "uid": {"type": "string", "description": "UID is the unique in time and space value "
                "for this object."},
        "resourceVersion": {"type": "string", "description": "An opaque value that "
                            "represents the internal version of this object."},
        "generation": {"type": "integer", "format": "int64", "description": "A sequence "
                       "number representing a specific generation of the desired state."},
        "creationTimestamp": {"type": "string", "format": "date-time"},
        "deletionTimestamp": {"type": "string", "format": "date-time"},
        "finalizers": {"type": "array", "items": {"type": "string"}},
        "ownerReferences": {"type": "array", "items": {"type": "object",
                            "x-kubernetes-preserve-unknown-fields": True}},
    },
}

_API_VERSION = {"type": "string", "description": "APIVersion defines the versioned schema "
                "of this representation of an object."}
_KIND = {"type": "string", "description": "Kind is a string value representing the REST "
         "resource this object represents."}


def schema_name(rt):
    if not rt.group:
        return "io.k8s.api.core.v1.%s" % rt.kind
    rev = ".".join(reversed(rt.group.split(".")))
    return "%s.%s.%s" % (rev, rt.version, rt.kind)


def _gvk(rt):
    return {"group": rt.group, "version": rt.version, "kind": rt.kind}


def _schema_for(rt):
    if rt.crd_name:
        s = copy.deepcopy(rt.schema or {"type": "object"})
        s.setdefault("type", "object")
    else:
        s = {"type": "object",
             "description": "%s (the API stand-in serves a minimal schema)." % rt.kind,
             "properties": {"spec": {"type": "object",
                                     "x-kubernetes-preserve-unknown-fields": True},
                            "status": {"type": "object",
                                       "x-kubernetes-preserve-unknown-fields": True},
                            "data": {"type": "object", "additionalProperties": {
                                "type": "string"}}}}
    props = s.setdefault("properties", {})
    props["apiVersion"] = _API_VERSION
    props["kind"] = _KIND
    props["metadata"] = {"allOf": [{"$ref": "#/components/schemas/" + OBJECT_META}],
                         "description": "Standard object's metadata."}
    if rt.crd_name:
        # Built-in kinds stay unmarked: kubectl would compute strategic merge
        # patches from these minimal schemas (and warn); unmarked, it uses its
        # compiled-in types. The cost: `kubectl explain` works for CRDs only.
        s["x-kubernetes-group-version-kind"] = [_gvk(rt)]
    return s


_PARAMS = [{"name": n, "in": "query", "schema": {"type": "string"}}
           for n in ("dryRun", "fieldManager", "fieldValidation")]


def _op(rt, action, params=True):
    op = {"operationId": "%s%s" % (action, rt.kind), "tags": [rt.gv_path],
          "x-kubernetes-action": action, "x-kubernetes-group-version-kind": _gvk(rt),
          "responses": {"200": {"description": "OK", "content": {"application/json": {
              "schema": {"$ref": "#/components/schemas/" + schema_name(rt)}}}}}}
    if params:
        op["parameters"] = list(_PARAMS)
    if action in ("post", "put", "patch"):
        ctypes = ["application/json"] if action != "patch" else [
            "application/json-patch+json", "application/merge-patch+json",
            "application/apply-patch+yaml"]
        # Strategic merge is accepted for built-in kinds but not listed: kubectl
        # would then compute patches from these minimal schemas and warn; without
        # it kubectl falls back to its compiled-in types.
        op["requestBody"] = {"content": {c: {"schema": {"$ref": "#/components/schemas/"
                                                        + schema_name(rt)}} for c in ctypes}}
    return op


def document(rts):
    paths, schemas = {}, {OBJECT_META: _META_SCHEMA}
    for rt in rts:
        base = "/" + rt.gv_path + ("/namespaces/{namespace}" if rt.namespaced else "")
        coll = "%s/%s" % (base, rt.plural)
        paths[coll] = {"get": _op(rt, "list", False), "post": _op(rt, "post")}
        paths[coll + "/{name}"] = {"get": _op(rt, "get", False), "put": _op(rt, "put"),
                                   "patch": _op(rt, "patch"),
                                   "delete": _op(rt, "delete", False)}
        if "status" in rt.subresources:
            paths[coll + "/{name}/status"] = {"get": _op(rt, "get", False),
                                              "put": _op(rt, "put"),
                                              "patch": _op(rt, "patch")}
        schemas[schema_name(rt)] = _schema_for(rt)
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.33.0"},
            "paths": paths, "components": {"schemas": schemas}}


def documents(registry):
    """{gv_path: (document, hash)} for every group/version."""
    by_gv = {}
    for rt in registry.types():
        by_gv.setdefault(rt.gv_path, []).append(rt)
    out = {}
    for gv, rts in sorted(by_gv.items()):
        doc = document(sorted(rts, key=lambda r: r.plural))
        digest = hashlib.sha512(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:64]
        out[gv] = (doc, digest)
    return out


def index(docs):
    return {"paths": {gv: {"serverRelativeURL": "/openapi/v3/%s?hash=%s" % (gv, h)}
                      for gv, (_, h) in docs.items()}}
