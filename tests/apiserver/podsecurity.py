"""Pod Security Standards, the checks of the baseline and restricted levels that
concern what controllers usually get wrong (the real admission has a few more, e.g.
AppArmor, SELinux types, /proc mount, sysctls). Messages are worded like the real ones:
'allowPrivilegeEscalation != false (container "w" must set
securityContext.allowPrivilegeEscalation=false)'."""

RESTRICTED_VOLUMES = ("configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                      "persistentVolumeClaim", "projected", "secret")
BASELINE_CAPS = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                 "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}


def _containers(spec):
    return [c for key in ("initContainers", "containers", "ephemeralContainers")
            for c in spec.get(key) or []]


def _names(cs):
    return ", ".join('"%s"' % c.get("name", "") for c in cs)


def _list(cs):
    return "%s %s" % ("container" if len(cs) == 1 else "containers", _names(cs))


def violations(pod, level):
    """The violations of `level` (privileged | baseline | restricted) by a pod."""
    if level not in ("baseline", "restricted"):
        return []
    spec = pod.get("spec") or {}
    psc = spec.get("securityContext") or {}
    cs = _containers(spec)
    out = []
    host = [f for f in ("hostNetwork", "hostPID", "hostIPC") if spec.get(f)]
    if host:
        out.append("host namespaces (%s)" % ", ".join("%s=true" % f for f in host))
    priv = [c for c in cs if (c.get("securityContext") or {}).get("privileged")]
    if priv:
        out.append("privileged (%s must not set securityContext.privileged=true)" % _list(priv))
    added = [c for c in cs if set(((c.get("securityContext") or {}).get("capabilities") or {}).get("add") or [])
             - (BASELINE_CAPS if level == "baseline" else {"NET_BIND_SERVICE"})]
    if added:
        out.append("unrestricted capabilities (%s must not include capabilities in "
                   "securityContext.capabilities.add)" % _list(added))
    hostpath = [v for v in spec.get("volumes") or [] if "hostPath" in v]
    if hostpath:
        out.append("hostPath volumes (volume %s)" % _names(hostpath))
    ports = [c for c in cs if any(p.get("hostPort") for p in c.get("ports") or [])]
    if ports:
        out.append("hostPort (%s uses hostPort)" % _list(ports))
    if level == "baseline":
        return out

    other = [v for v in spec.get("volumes") or []
             if not any(k in v for k in RESTRICTED_VOLUMES) and "hostPath" not in v]
    if other:
        out.append("restricted volume types (volume %s uses a restricted volume type)" % _names(other))
    esc = [c for c in cs if (c.get("securityContext") or {}).get("allowPrivilegeEscalation") is not False]
    if esc:
        out.append("allowPrivilegeEscalation != false (%s must set "
                   "securityContext.allowPrivilegeEscalation=false)" % _list(esc))
    nodrop = [c for c in cs if "ALL" not in (((c.get("securityContext") or {}).get("capabilities") or {})
                                             .get("drop") or [])]
    if nodrop:
        out.append('unrestricted capabilities (%s must set securityContext.capabilities.drop=["ALL"])'
                   % _list(nodrop))
    pod_nonroot = psc.get("runAsNonRoot") is True
    root = [c for c in cs if (c.get("securityContext") or {}).get("runAsNonRoot") is False or
            (not pod_nonroot and (c.get("securityContext") or {}).get("runAsNonRoot") is not True)]
    if root:
        out.append("runAsNonRoot != true (pod or %s must set securityContext.runAsNonRoot=true)" % _list(root))
    uid0 = [c for c in cs if (c.get("securityContext") or {}).get("runAsUser", psc.get("runAsUser")) == 0]
    if uid0:
        out.append("runAsUser=0 (pod or %s must not set runAsUser=0)" % _list(uid0))
    pod_seccomp = (psc.get("seccompProfile") or {}).get("type") in ("RuntimeDefault", "Localhost")
    nosec = []
    for c in cs:
        t = ((c.get("securityContext") or {}).get("seccompProfile") or {}).get("type")
        if t == "Unconfined" or (t is None and not pod_seccomp):
            nosec.append(c)
    if nosec:
        out.append('seccompProfile (pod or %s must set securityContext.seccompProfile.type to "RuntimeDefault" '
                   'or "Localhost")' % _list(nosec))
    return out
