"""A small CEL evaluator for x-kubernetes-validations rules.

Supported subset: literals (int, double, string, bool, null, lists, maps),
self / oldSelf, field selection, indexing, has(), size(), arithmetic
(+ - * / %), comparisons, 'in', !, &&, || (error-absorbing as in CEL), ?: ,
int()/double()/string()/bool() conversions, string methods (size, startsWith,
endsWith, contains, matches, lowerAscii, upperAscii) and the list macros
all/exists/exists_one/map/filter. No types beyond JSON, no timestamps,
durations, quantities or cost limits.
"""
import re


class CelError(Exception):
    pass


_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<num>\d+\.\d*(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+|0x[0-9a-fA-F]+u?|\d+u?)
  | (?P<str>[rR]?"(?:[^"\\]|\\.)*"|[rR]?'(?:[^'\\]|\\.)*')
  | (?P<op>\|\||&&|==|!=|<=|>=|[-+*/%<>!?:.,()\[\]{}])
  | (?P<id>[A-Za-z_][A-Za-z0-9_]*)
""", re.VERBOSE)

_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", "'": "'", '"': '"', "0": "\0"}


def _unquote(tok):
    raw = tok[0] in "rR"
    body = tok[2:-1] if raw else tok[1:-1]
    if raw:
        return body
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(1)), body)


def tokenize(src):
    out, pos = [], 0
    while pos < len(src):
        m = _TOKEN.match(src, pos)
        if not m:
            raise CelError("Syntax error: unexpected %r at %d" % (src[pos], pos))
        pos = m.end()
        kind = m.lastgroup
        if kind == "ws":
            continue
        text = m.group()
        if kind == "num":
            text = text.rstrip("uU")
            val = int(text, 16) if text.startswith("0x") else (
                float(text) if any(c in text for c in ".eE") else int(text))
            out.append(("lit", val))
        elif kind == "str":
            out.append(("lit", _unquote(text)))
        elif kind == "id" and text in ("true", "false", "null"):
            out.append(("lit", {"true": True, "false": False, "null": None}[text]))
        elif kind == "id" and text == "in":
            out.append(("op", "in"))
        else:
            out.append((kind, text))
    out.append(("end", None))
    return out


class _Parser:
    def __init__(self, src):
        self.toks, self.i = tokenize(src), 0

    def peek(self):
        return self.toks[self.i]

    def take(self, text=None):
        tok = self.toks[self.i]
        if text is not None and tok[1] != text:
            raise CelError("Syntax error: expected %r, got %r" % (text, tok[1]))
        self.i += 1
        return tok

    def at(self, *texts):
        tok = self.peek()
        return tok[0] == "op" and tok[1] in texts

    def parse(self):
        node = self.expr()
        if self.peek()[0] != "end":
            raise CelError("Syntax error: unexpected %r" % (self.peek()[1],))
        return node

    def expr(self):
        cond = self.binary(0)
        if self.at("?"):
            self.take()
            a = self.expr()
            self.take(":")
            return ("cond", cond, a, self.expr())
        return cond

    _LEVELS = [("||",), ("&&",), ("==", "!=", "<", "<=", ">", ">=", "in"),
               ("+", "-"), ("*", "/", "%")]

    def binary(self, level):
        if level == len(self._LEVELS):
            return self.unary()
        node = self.binary(level + 1)
        while self.at(*self._LEVELS[level]):
            op = self.take()[1]
            node = ("bin", op, node, self.binary(level + 1))
        return node

    def unary(self):
        if self.at("!", "-"):
            op = self.take()[1]
            return ("un", op, self.unary())
        return self.member()

    def args(self, close):
        items = []
        while not self.at(close):
            items.append(self.expr())
            if not self.at(close):
                self.take(",")
        self.take(close)
        return items

    def member(self):
        node = self.primary()
        while True:
            if self.at("."):
                self.take()
                name = self.take()[1]
                if self.at("("):
                    self.take()
                    node = ("mcall", node, name, self.args(")"))
                else:
                    node = ("sel", node, name)
            elif self.at("["):
                self.take()
                idx = self.expr()
                self.take("]")
                node = ("idx", node, idx)
            else:
                return node

    def primary(self):
        kind, text = self.take()
        if kind == "lit":
            return ("lit", text)
        if kind == "id":
            if self.at("("):
                self.take()
                return ("call", text, self.args(")"))
            return ("id", text)
        if text == "(":
            node = self.expr()
            self.take(")")
            return node
        if text == "[":
            return ("list", self.args("]"))
        if text == "{":
            pairs = []
            while not self.at("}"):
                k = self.expr()
                self.take(":")
                pairs.append((k, self.expr()))
                if not self.at("}"):
                    self.take(",")
            self.take("}")
            return ("map", pairs)
        raise CelError("Syntax error: unexpected %r" % (text,))


_CACHE = {}


def compile_rule(src):
    if src not in _CACHE:
        _CACHE[src] = _Parser(src).parse()
    return _CACHE[src]


def uses_old_self(src):
    return re.search(r"\boldSelf\b", src) is not None


def evaluate(src, env):
    """Evaluate rule text with variables in env; raises CelError."""
    return _eval(compile_rule(src), env)


def _num(v):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise CelError("no such overload")
    return v


def _eval(node, env):
    kind = node[0]
    if kind == "lit":
        return node[1]
    if kind == "id":
        if node[1] not in env:
            raise CelError("undeclared reference to '%s'" % node[1])
        return env[node[1]]
    if kind == "sel":
        obj = _eval(node[1], env)
        if not isinstance(obj, dict) or node[2] not in obj:
            raise CelError("no such key: %s" % node[2])
        return obj[node[2]]
    if kind == "idx":
        obj, idx = _eval(node[1], env), _eval(node[2], env)
        try:
            return obj[idx]
        except (KeyError, IndexError, TypeError):
            raise CelError("no such key: %s" % (idx,))
    if kind == "list":
        return [_eval(x, env) for x in node[1]]
    if kind == "map":
        return {_eval(k, env): _eval(v, env) for k, v in node[1]}
    if kind == "cond":
        c = _eval(node[1], env)
        if not isinstance(c, bool):
            raise CelError("no such overload")
        return _eval(node[2] if c else node[3], env)
    if kind == "un":
        v = _eval(node[2], env)
        if node[1] == "!":
            if not isinstance(v, bool):
                raise CelError("no such overload")
            return not v
        return -_num(v)
    if kind == "bin":
        return _binary(node, env)
    if kind == "call":
        return _call(node[1], node[2], env)
    if kind == "mcall":
        return _method(node, env)
    raise CelError("unknown node %r" % (kind,))


def _logic(node, env):
    op, decisive = node[1], node[1] == "||"
    err = None
    for side in (node[2], node[3]):
        try:
            v = _eval(side, env)
            if not isinstance(v, bool):
                raise CelError("no such overload")
            if v == decisive:
                return v
        except CelError as e:
            err = err or e
    if err:
        raise err
    return not decisive


def _binary(node, env):
    op = node[1]
    if op in ("||", "&&"):
        return _logic(node, env)
    a, b = _eval(node[2], env), _eval(node[3], env)
    if op in ("==", "!="):
        same = a == b and isinstance(a, bool) == isinstance(b, bool)
        return same if op == "==" else not same
    if op == "in":
        if isinstance(b, (list, dict)):
            return a in b
        raise CelError("no such overload")
    if op in ("<", "<=", ">", ">="):
        if isinstance(a, str) != isinstance(b, str):
            raise CelError("no such overload")
        return {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]
    if op == "+":
        if isinstance(a, (str, list)) and type(a) is type(b):
            return a + b
        return _num(a) + _num(b)
    a, b = _num(a), _num(b)
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if isinstance(a, int) and isinstance(b, int):
        if b == 0:
            raise CelError("division by zero" if op == "/" else "modulus by zero")
        q = abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1)   # truncates
        return q if op == "/" else a - q * b
    if op == "%":
        raise CelError("no such overload")
    if b == 0:
        return float("inf") if a > 0 else float("-inf") if a < 0 else float("nan")
    return a / b


def _call(name, args, env):
    if name == "has":
        arg = args[0] if len(args) == 1 else None
        if not arg or arg[0] != "sel":
            raise CelError("invalid argument to has() macro")
        obj = _eval(arg[1], env)
        return isinstance(obj, dict) and arg[2] in obj
    vals = [_eval(a, env) for a in args]
    if name == "size" and len(vals) == 1:
        return len(vals[0])
    conv = {"int": int, "double": float, "string": _to_string, "bool": _to_bool}
    if name in conv and len(vals) == 1:
        try:
            return conv[name](vals[0])
        except (ValueError, TypeError):
            raise CelError("%s conversion error" % name)
    raise CelError("found no matching overload for '%s'" % name)


def _to_string(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _to_bool(v):
    if isinstance(v, bool):
        return v
    if v in ("true", "True", "TRUE", "t", "1"):
        return True
    if v in ("false", "False", "FALSE", "f", "0"):
        return False
    raise ValueError(v)


_MACROS = ("all", "exists", "exists_one", "map", "filter")


def _method(node, env):
    _, recv_node, name, args = node
    recv = _eval(recv_node, env)
    if name in _MACROS:
        if len(args) != 2 or args[0][0] != "id":
            raise CelError("invalid macro %s" % name)
        var, body = args[0][1], args[1]
        items = list(recv.keys()) if isinstance(recv, dict) else recv
        results = []
        for item in items:
            sub = dict(env)
            sub[var] = item
            results.append((item, _eval(body, sub)))
        if name == "all":
            return all(r for _, r in results)
        if name == "exists":
            return any(r for _, r in results)
        if name == "exists_one":
            return sum(1 for _, r in results if r) == 1
        if name == "map":
            return [r for _, r in results]
        return [i for i, r in results if r]
    vals = [_eval(a, env) for a in args]
    if name == "size" and not vals:
        return len(recv)
    if isinstance(recv, str):
        if name == "startsWith":
            return recv.startswith(vals[0])
        if name == "endsWith":
            return recv.endswith(vals[0])
        if name == "contains":
            return vals[0] in recv
        if name == "matches":
            return re.search(vals[0], recv) is not None
        if name == "lowerAscii":
            return recv.lower()
        if name == "upperAscii":
            return recv.upper()
    raise CelError("found no matching overload for '%s'" % name)
