"""A small validator for the structural OpenAPI v3 schemas of CustomResourceDefinitions:
enough to check the schema's own defaults and example objects (types, enums, bounds,
lengths, required and unknown fields). CEL rules are not evaluated here."""

SCALAR_TYPES = {"string": str, "boolean": bool, "integer": int, "number": (int, float)}


def walk(schema, path=""):
    """Yields (path, node) for every schema node, depth first."""
    yield path, schema
    for name, sub in (schema.get("properties") or {}).items():
        yield from walk(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from walk(schema["additionalProperties"], f"{path}{{}}")


def _type_ok(schema, value):
    if schema.get("x-kubernetes-int-or-string"):
        return isinstance(value, (int, str)) and not isinstance(value, bool)
    t = schema.get("type")
    if t is None:
        return True
    if t == "object":
        return isinstance(value, dict)
    if t == "array":
        return isinstance(value, list)
    if isinstance(value, bool) and t != "boolean":
        return False
    return isinstance(value, SCALAR_TYPES[t])


def validate(schema, value, path="", problems=None):
    """Problems of value against schema, as 'path: what' strings."""
    problems = [] if problems is None else problems
    if not _type_ok(schema, value):
        problems.append(f"{path}: {value!r} is not of type {schema.get('type')}")
        return problems
    if "enum" in schema and value not in schema["enum"]:
        problems.append(f"{path}: {value!r} is not one of {schema['enum']}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        lo, hi = schema.get("minimum"), schema.get("maximum")
        if lo is not None and (value < lo or (schema.get("exclusiveMinimum") and value == lo)):
            problems.append(f"{path}: {value} is below the minimum {lo}")
        if hi is not None and (value > hi or (schema.get("exclusiveMaximum") and value == hi)):
            problems.append(f"{path}: {value} is above the maximum {hi}")
    if isinstance(value, str):
        if len(value) > schema.get("maxLength", len(value)) or len(value) < schema.get("minLength", 0):
            problems.append(f"{path}: length {len(value)} outside [{schema.get('minLength', 0)}, {schema.get('maxLength')}]")
    if isinstance(value, list):
        if len(value) > schema.get("maxItems", len(value)):
            problems.append(f"{path}: more than {schema['maxItems']} items")
        for i, item in enumerate(value):
            validate(schema.get("items", {}), item, f"{path}[{i}]", problems)
    if isinstance(value, dict) and not schema.get("x-kubernetes-preserve-unknown-fields"):
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        for req in schema.get("required", []):
            if req not in value:
                problems.append(f"{path}.{req}: required")
        for k, v in value.items():
            if k in props:
                validate(props[k], v, f"{path}.{k}", problems)
            elif isinstance(extra, dict):
                validate(extra, v, f"{path}.{k}", problems)
            elif props or extra is not None:
                problems.append(f"{path}.{k}: unknown field")
    return problems


def resolve(schema, dotted):
    """The schema node at a dotted path below schema ('spec.algorithm.mode'), or None."""
    node = schema
    for part in dotted.split("."):
        props = node.get("properties") or {}
        if part not in props:
            return None
        node = props[part]
    return node
