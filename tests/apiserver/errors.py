"""API errors rendered as metav1 Status objects, worded like the real server."""


class ApiError(Exception):
    def __init__(self, code, reason, message, details=None):
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message
        self.details = details

    def status(self):
        st = {"kind": "Status", "apiVersion": "v1", "metadata": {},
              "status": "Failure", "message": self.message,
              "reason": self.reason, "code": self.code}
        if self.details is not None:
            st["details"] = self.details
        return st


def _qualified(rt):
    return rt.plural + ("." + rt.group if rt.group else "")


def _details(rt, name):
    d = {"name": name, "kind": rt.plural}
    if rt.group:
        d["group"] = rt.group
    return d


def not_found(rt, name):
    return ApiError(404, "NotFound", '%s "%s" not found' % (_qualified(rt), name),
                    _details(rt, name))


def namespace_not_found(ns):
    return ApiError(404, "NotFound", 'namespaces "%s" not found' % ns,
                    {"name": ns, "kind": "namespaces"})


def already_exists(rt, name):
    return ApiError(409, "AlreadyExists", '%s "%s" already exists' % (_qualified(rt), name),
                    _details(rt, name))


def conflict(rt, name, why="the object has been modified; please apply your changes "
                           "to the latest version and try again"):
    return ApiError(409, "Conflict", 'Operation cannot be fulfilled on %s "%s": %s'
                    % (_qualified(rt), name, why), _details(rt, name))


def bad_request(message):
    return ApiError(400, "BadRequest", message)


def gone(message):
    return ApiError(410, "Expired", message)


def method_not_allowed(message="the server does not allow this method on the requested resource"):
    return ApiError(405, "MethodNotAllowed", message)


def unsupported_media(ctype):
    return ApiError(415, "UnsupportedMediaType",
                    'the body of the request was in an unknown format - accepted media types '
                    'include: application/json-patch+json, application/merge-patch+json, '
                    'application/strategic-merge-patch+json (got %s)' % ctype)


def invalid(rt, name, causes):
    """causes: list of (field, type, message-after-field) like field.Error.

    The message joins 'field: detail' pairs, bracketed when several, as
    apimachinery's NewInvalid does.
    """
    texts = ["%s: %s" % (f, m) if f else m for f, _t, m in causes]
    joined = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
    kind = rt.kind + ("." + rt.group if rt.group else "")
    return ApiError(422, "Invalid", '%s "%s" is invalid: %s' % (kind, name, joined),
                    {"name": name, "group": rt.group, "kind": rt.kind,
                     "causes": [{"reason": t, "message": m, "field": f}
                                for f, t, m in causes]})
