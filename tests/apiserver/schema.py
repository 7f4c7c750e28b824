"""Structural OpenAPI v3 schemas of custom resources: pruning (or strict
rejection) of unknown fields, defaulting, validation and CEL rules.

Field errors are (path, reason, message) with messages worded like the
real apiserver's (kube-openapi validate + field.Error formatting).
"""
import copy
import json
import re

import cel

ROOT_KEEP = ("apiVersion", "kind", "metadata")


def _show(v):
    """How field.Error prints a value."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (int, float)):
        return repr(v)
    return json.dumps(_type_name(v))


def _type_name(v):
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    return "object"


def _join(path, key):
    return "%s.%s" % (path, key) if path else key


# ---- pruning ------------------------------------------------------------------
def prune(schema, value, path="", unknown=None, root=True):
    """Drop fields the schema does not declare; record them in unknown."""
    if unknown is None:
        unknown = []
    if value is None:
        return value
    if isinstance(value, dict):
        props = schema.get("properties")
        addl = schema.get("additionalProperties")
        keep_all = schema.get("x-kubernetes-preserve-unknown-fields") or \
            isinstance(addl, dict) or addl is True
        embedded = schema.get("x-kubernetes-embedded-resource")
        for key in list(value):
            if (root or embedded) and key in ROOT_KEEP:
                continue                     # metadata is ObjectMeta, not pruned here
            sub = (props or {}).get(key)
            if sub is None and isinstance(addl, dict):
                sub = addl
            if sub is not None:
                value[key] = prune(sub, value[key], _join(path, key), unknown, False)
                if value[key] is None and not sub.get("nullable"):
                    del value[key]           # null without nullable is pruned
            elif not keep_all:
                unknown.append(_join(path, key))
                del value[key]
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            value[i] = prune(schema["items"], item, "%s[%d]" % (path, i), unknown, False)
    return value


# ---- defaulting -----------------------------------------------------------------
def apply_defaults(schema, value):
    if isinstance(value, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                value[key] = apply_defaults(sub, value[key])
        addl = schema.get("additionalProperties")
        if isinstance(addl, dict):
            for key in value:
                value[key] = apply_defaults(addl, value[key])
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            value[i] = apply_defaults(schema["items"], item)
    return value


# ---- validation -------------------------------------------------------------------
_TYPES = {
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
}


def validate(schema, value, path, errs):
    """Append (path, reason, message) for every violation of schema by value."""
    if value is None:
        if not schema.get("nullable") and schema.get("type"):
            errs.append((path, "FieldValueTypeInvalid", 'Invalid value: "null": %s in body '
                         'must be of type %s: "null"' % (path, schema["type"])))
        return
    if schema.get("x-kubernetes-int-or-string"):
        if not (_TYPES["integer"](value) or isinstance(value, str)):
            errs.append((path, "FieldValueTypeInvalid", "Invalid value: %s: %s in body must "
                         "be of type int-or-string: %s" % (_show(value), path,
                                                          json.dumps(_type_name(value)))))
            return
    elif schema.get("type") and schema["type"] in _TYPES and not _TYPES[schema["type"]](value):
        t = _type_name(value)
        errs.append((path, "FieldValueTypeInvalid", 'Invalid value: "%s": %s in body must be '
                     'of type %s: "%s"' % (t, path, schema["type"], t)))
        return
    _combinators(schema, value, path, errs)
    if "enum" in schema and value not in schema["enum"]:
        errs.append((path, "FieldValueNotSupported", "Unsupported value: %s: supported "
                     "values: %s" % (_show(value), ", ".join(_show(e) for e in schema["enum"]))))
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        _numeric(schema, value, path, errs)
    if isinstance(value, str):
        _string(schema, value, path, errs)
    if isinstance(value, list):
        _array(schema, value, path, errs)
    if isinstance(value, dict):
        _object(schema, value, path, errs)


def _combinators(schema, value, path, errs):
    for sub in schema.get("allOf") or []:
        validate(sub, value, path, errs)
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        if branches:
            ok = 0
            for sub in branches:
                e = []
                validate(sub, value, path, e)
                ok += not e
            if (key == "anyOf" and not ok) or (key == "oneOf" and ok != 1):
                errs.append((path, "FieldValueInvalid", "Invalid value: %s: %s in body must "
                             "validate %s" % (_show(value), path,
                                              "at least one schema (anyOf)" if key == "anyOf"
                                              else "one and only one schema (oneOf)")))


def _numeric(schema, v, path, errs):
    show = "Invalid value: %s: %s in body" % (_show(v), path)
    if "minimum" in schema:
        if schema.get("exclusiveMinimum") and v <= schema["minimum"]:
            errs.append((path, "FieldValueInvalid", "%s should be greater than %s"
                         % (show, schema["minimum"])))
        elif v < schema["minimum"]:
            errs.append((path, "FieldValueInvalid", "%s should be greater than or equal to %s"
                         % (show, schema["minimum"])))
    if "maximum" in schema:
        if schema.get("exclusiveMaximum") and v >= schema["maximum"]:
            errs.append((path, "FieldValueInvalid", "%s should be less than %s"
                         % (show, schema["maximum"])))
        elif v > schema["maximum"]:
            errs.append((path, "FieldValueInvalid", "%s should be less than or equal to %s"
                         % (show, schema["maximum"])))
    m = schema.get("multipleOf")
    if m and (v / m) != int(v / m):
        errs.append((path, "FieldValueInvalid", "%s should be a multiple of %s" % (show, m)))


def _string(schema, v, path, errs):
    show = "Invalid value: %s: %s in body" % (_show(v), path)
    if "minLength" in schema and len(v) < schema["minLength"]:
        errs.append((path, "FieldValueInvalid", "%s should be at least %d chars long"
                     % (show, schema["minLength"])))
    if "maxLength" in schema and len(v) > schema["maxLength"]:
        errs.append((path, "FieldValueTooLong", "Too long: may not be more than %d bytes"
                     % schema["maxLength"]))
    if "pattern" in schema and not re.search(schema["pattern"], v):
        errs.append((path, "FieldValueInvalid", "%s should match '%s'"
                     % (show, schema["pattern"])))


def _array(schema, v, path, errs):
    if "minItems" in schema and len(v) < schema["minItems"]:
        errs.append((path, "FieldValueInvalid", "Invalid value: %d: %s in body should have "
                     "at least %d items" % (len(v), path, schema["minItems"])))
    if "maxItems" in schema and len(v) > schema["maxItems"]:
        errs.append((path, "FieldValueTooMany", "Too many: %d: must have at most %d items"
                     % (len(v), schema["maxItems"])))
    items = schema.get("items")
    if isinstance(items, dict):
        for i, item in enumerate(v):
            validate(items, item, "%s[%d]" % (path, i), errs)
    if schema.get("x-kubernetes-list-type") == "map":
        keys = schema.get("x-kubernetes-list-map-keys") or []
        seen = set()
        for i, item in enumerate(v):
            k = tuple(json.dumps(item.get(key)) for key in keys) if isinstance(item, dict) else i
            if k in seen:
                errs.append(("%s[%d]" % (path, i), "FieldValueDuplicate",
                             "Duplicate value: %s" % json.dumps(
                                 {key: item.get(key) for key in keys})))
            seen.add(k)


def _object(schema, v, path, errs):
    for req in schema.get("required") or []:
        if req not in v:
            errs.append((_join(path, req), "FieldValueRequired", "Required value"))
    props = schema.get("properties") or {}
    addl = schema.get("additionalProperties")
    for key, val in v.items():
        if key in props:
            validate(props[key], val, _join(path, key), errs)
        elif isinstance(addl, dict):
            validate(addl, val, _join(path, key), errs)
    if "minProperties" in schema and len(v) < schema["minProperties"]:
        errs.append((path, "FieldValueInvalid", "Invalid value: %d: %s in body should have "
                     "at least %d properties" % (len(v), path, schema["minProperties"])))
    if "maxProperties" in schema and len(v) > schema["maxProperties"]:
        errs.append((path, "FieldValueTooMany", "Too many: %d: must have at most %d items"
                     % (len(v), schema["maxProperties"])))


# ---- CEL rules ------------------------------------------------------------------------
def validate_cel(schema, value, old, path, errs):
    if value is None:
        return
    for rule in schema.get("x-kubernetes-validations") or []:
        text = rule.get("rule", "")
        if cel.uses_old_self(text) and old is None:
            continue                         # transition rules skip creates
        env = {"self": value, "oldSelf": old}
        field = path + (rule.get("fieldPath") or "") if rule.get("fieldPath") else path
        field = field.lstrip(".")
        try:
            ok = cel.evaluate(text, env)
        except cel.CelError as e:
            errs.append((field, "FieldValueInvalid", "Invalid value: %s: %s evaluating rule: %s"
                         % (json.dumps(_type_name(value)), e, text)))
            continue
        if ok is not True:
            msg = rule.get("message") or "failed rule: %s" % text
            if rule.get("messageExpression"):
                try:
                    msg = str(cel.evaluate(rule["messageExpression"], env))
                except cel.CelError:
                    pass
            reason = rule.get("reason", "FieldValueInvalid")
            prefix = {"FieldValueForbidden": "Forbidden",
                      "FieldValueRequired": "Required value",
                      "FieldValueDuplicate": "Duplicate value"}.get(reason)
            text_out = "%s: %s" % (prefix, msg) if prefix else \
                "Invalid value: %s: %s" % (json.dumps(_type_name(value)), msg)
            errs.append((field, reason, text_out))
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        addl = schema.get("additionalProperties")
        for key, val in value.items():
            sub = props.get(key) or (addl if isinstance(addl, dict) else None)
            if sub:
                oldv = old.get(key) if isinstance(old, dict) else None
                validate_cel(sub, val, oldv, _join(path, key), errs)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            validate_cel(schema["items"], item, None, "%s[%d]" % (path, i), errs)


def process(schema, obj, old, strict):
    """Prune, default and validate a custom resource.

    Returns (obj, unknown_fields, errors); with strict, unknown fields are
    reported (the caller rejects) rather than silently dropped.
    """
    obj = copy.deepcopy(obj)
    unknown = []
    prune(schema, obj, "", unknown)
    apply_defaults(schema, obj)
    errs = []
    body = {k: v for k, v in obj.items() if k not in ROOT_KEEP}
    root = dict(schema)
    root["properties"] = {k: v for k, v in (schema.get("properties") or {}).items()
                          if k not in ROOT_KEEP}
    validate(root, body, "", errs)
    # Root rules see the whole object (self.metadata.name is allowed).
    validate_cel(root, obj, old, "", errs)
    return obj, (unknown if strict else []), errs
