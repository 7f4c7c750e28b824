"""How a container's process is set up: environment (env, envFrom, valueFrom),
$(VAR) expansion, volumes materialized on the host, and path translation of
mount paths inside env values and arguments."""
import base64
import os
import re


class ConfigError(Exception):
    """CreateContainerConfigError: a referenced ConfigMap/Secret key is missing."""


_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)|\$\$")


def expand(text, env):
    """Kubernetes $(VAR) expansion; $$ escapes, unknown references stay."""
    def sub(m):
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))
    return _VAR.sub(sub, text)


class Lookup:
    """Reads ConfigMaps and Secrets from the store."""

    def __init__(self, store, registry, ns):
        self.store, self.registry, self.ns = store, registry, ns

    def _get(self, plural, name):
        rt = self.registry.lookup("", "v1", plural)
        return self.store.find(rt, self.ns, name)

    def data(self, plural, name, optional):
        obj = self._get(plural, name)
        if obj is None:
            if optional:
                return None
            raise ConfigError('%s "%s" not found' % (plural[:-1], name))
        if plural == "secrets":
            return {k: base64.b64decode(v).decode("utf-8", "replace")
                    for k, v in (obj.get("data") or {}).items()}
        return dict(obj.get("data") or {})

    def key(self, plural, ref):
        data = self.data(plural, ref.get("name", ""), ref.get("optional"))
        if data is None:
            return None
        if ref.get("key") not in data:
            if ref.get("optional"):
                return None
            raise ConfigError("couldn't find key %s in %s %s/%s"
                              % (ref.get("key"), plural[:-1], self.ns, ref.get("name")))
        return data[ref["key"]]


def _field_ref(pod, path):
    md = pod["metadata"]
    m = re.match(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    if m:
        return (md.get(m.group(1)) or {}).get(m.group(2), "")
    simple = {
        "metadata.name": md.get("name"), "metadata.namespace": md.get("namespace"),
        "metadata.uid": md.get("uid"), "spec.nodeName": pod["spec"].get("nodeName"),
        "spec.serviceAccountName": pod["spec"].get("serviceAccountName", "default"),
        "status.podIP": (pod.get("status") or {}).get("podIP"),
        "status.hostIP": "127.0.0.1", "status.podIPs": (pod.get("status") or {}).get("podIP"),
    }
    return simple.get(path) or ""


def _resource_ref(container, ref):
    res = ref.get("resource", "")
    kind, _, name = res.partition(".")
    value = ((container.get("resources") or {}).get(kind) or {}).get(name)
    if value is None:
        value = str(os.cpu_count() or 1) if name == "cpu" else "0"
    return str(value)


def materialize_volumes(pod, pod_dir, lookup):
    """Create host dirs for emptyDir/configMap/secret volumes: {name: host path}.
    hostPath volumes map to their own path."""
    out = {}
    for vol in pod["spec"].get("volumes") or []:
        name = vol.get("name")
        if "hostPath" in vol:
            out[name] = vol["hostPath"].get("path")
            continue
        path = os.path.join(pod_dir, "volumes", name)
        os.makedirs(path, exist_ok=True)
        out[name] = path
        for kind, plural in (("configMap", "configmaps"), ("secret", "secrets")):
            if kind in vol:
                src = vol[kind]
                data = lookup.data(plural, src.get("name") or src.get("secretName", ""),
                                   src.get("optional")) or {}
                items = src.get("items") or [{"key": k, "path": k} for k in data]
                for item in items:
                    if item["key"] in data:
                        target = os.path.join(path, item.get("path", item["key"]))
                        os.makedirs(os.path.dirname(target), exist_ok=True)
                        with open(target, "w") as f:
                            f.write(data[item["key"]])
    return out


def mount_map(container, volumes):
    """[(mountPath, host path)], longest mount path first."""
    pairs = []
    for m in container.get("volumeMounts") or []:
        host = volumes.get(m.get("name"))
        if host is None:
            continue
        if m.get("subPath"):
            host = os.path.join(host, m["subPath"])
        pairs.append((m.get("mountPath", "").rstrip("/") or "/", host))
    return sorted(pairs, key=lambda p: -len(p[0]))


def translate(text, mounts):
    """Rewrite a value that starts with a mount path to the host directory
    (the stand-in has no mount namespaces)."""
    for mount, host in mounts:
        if mount != host and (text == mount or text.startswith(mount + "/")):
            return host + text[len(mount):]
    return text


def build(pod, container, base_env, lookup, mounts):
    """Return (argv, env) for a container; raises ConfigError."""
    env = dict(base_env)
    for src in container.get("envFrom") or []:
        prefix = src.get("prefix", "")
        for kind, plural in (("configMapRef", "configmaps"), ("secretRef", "secrets")):
            if kind in src:
                data = lookup.data(plural, src[kind].get("name", ""), src[kind].get("optional"))
                for k, v in (data or {}).items():
                    env[prefix + k] = v
    for item in container.get("env") or []:
        name = item.get("name")
        if "valueFrom" in item:
            vf = item["valueFrom"]
            value = None
            if "fieldRef" in vf:
                value = _field_ref(pod, vf["fieldRef"].get("fieldPath", ""))
            elif "configMapKeyRef" in vf:
                value = lookup.key("configmaps", vf["configMapKeyRef"])
            elif "secretKeyRef" in vf:
                value = lookup.key("secrets", vf["secretKeyRef"])
            elif "resourceFieldRef" in vf:
                value = _resource_ref(container, vf["resourceFieldRef"])
            if value is None:
                continue
        else:
            value = expand(item.get("value", ""), env)
        env[name] = translate(value, mounts)
    argv = [translate(expand(a, env), mounts)
            for a in (container.get("command") or []) + (container.get("args") or [])]
    return argv, env
