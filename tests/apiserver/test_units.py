"""In-process checks of the pure parts: CEL, schema validation, patches,
selectors, printer-column JSONPath and the Scale of a custom resource."""
import unittest

import cel
import errors
import patch
import scale
import schema
import tables
from selection import match_labels, parse_label_selector


class CelTest(unittest.TestCase):
    def ev(me, rule, **env):  # noqa: N805 (the rules' variable is named self)
        return cel.evaluate(rule, env)

    def test_rules_of_the_editjob_crd(self):
        spec = {"mode": "a-edit", "syncSeconds": 2, "replicas": 2, "shardsPerReplica": 3}
        self.assertTrue(self.ev("self.mode != 'a-edit' || (has(self.syncSeconds) && "
                                "self.syncSeconds > 0)", self=spec))
        self.assertFalse(self.ev("self.mode != 'a-edit' || has(self.other)", self=spec))
        self.assertTrue(self.ev("self.replicas * self.shardsPerReplica <= 4096", self=spec))
        self.assertTrue(self.ev("!has(self.debug) || self.debug.rank < 1", self=spec))
        self.assertTrue(self.ev("!has(self.dim) || self.dim % self.heads == 0", self=spec))

    def test_operators_and_macros(self):
        self.assertEqual(self.ev("-7 / 2"), -3)
        self.assertEqual(self.ev("-7 % 2"), -1)
        self.assertTrue(self.ev("[1, 2, 3].all(x, x > 0) && [1, 2].exists(x, x == 2)"))
        self.assertTrue(self.ev("'abc'.startsWith('a') && size('abc') == 3 && 'b' in ['a', 'b']"))
        self.assertEqual(self.ev("true ? 'y' : 'n'"), "y")
        self.assertTrue(self.ev("self.missing > 1 || true", self={}))   # error absorbed
        with self.assertRaises(cel.CelError):
            self.ev("self.missing > 1", self={})


SCHEMA = {"type": "object", "properties": {"spec": {
    "type": "object", "required": ["n"],
    "properties": {"n": {"type": "integer", "minimum": 1},
                   "mode": {"type": "string", "enum": ["a", "b"], "default": "a"},
                   "name": {"type": "string", "pattern": "^[a-z]+$"},
                   "port": {"x-kubernetes-int-or-string": True},
                   "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                   "tags": {"type": "array", "maxItems": 1, "items": {"type": "string"}}}}}}


class SchemaTest(unittest.TestCase):
    def run_schema(self, spec, strict=False):
        return schema.process(SCHEMA, {"apiVersion": "x/v1", "kind": "X",
                                       "metadata": {"name": "a"}, "spec": spec}, None, strict)

    def test_defaults_pruning_and_preserved_fields(self):
        obj, unknown, errs = self.run_schema({"n": 1, "junk": 1, "free": {"any": {"x": 1}}})
        self.assertEqual(errs, [])
        self.assertEqual(obj["spec"], {"n": 1, "mode": "a", "free": {"any": {"x": 1}}})
        self.assertEqual(obj["metadata"], {"name": "a"})
        _, unknown, _ = self.run_schema({"n": 1, "junk": 1}, strict=True)
        self.assertEqual(unknown, ["spec.junk"])

    def test_error_messages(self):
        _, _, errs = self.run_schema({"n": 0, "mode": "c", "name": "A1", "port": 1.5,
                                      "tags": ["a", "b"]})
        text = {e[0]: e[2] for e in errs}
        self.assertEqual(text["spec.n"], "Invalid value: 0: spec.n in body should be greater "
                                         "than or equal to 1")
        self.assertEqual(text["spec.mode"], 'Unsupported value: "c": supported values: "a", "b"')
        self.assertIn("should match '^[a-z]+$'", text["spec.name"])
        self.assertIn("int-or-string", text["spec.port"])
        self.assertIn("must have at most 1 items", text["spec.tags"])
        _, _, errs = self.run_schema({})
        self.assertEqual(errs, [("spec.n", "FieldValueRequired", "Required value")])


class PatchAndSelectorTest(unittest.TestCase):
    def test_merge_and_strategic(self):
        self.assertEqual(patch.merge_patch({"a": {"b": 1, "c": 2}}, {"a": {"b": None, "d": 3}}),
                         {"a": {"c": 2, "d": 3}})
        pod = {"containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "y"}]}
        out = patch.strategic_merge(pod, {"containers": [{"name": "b", "image": "z"}],
                                          "$setElementOrder/containers": [{"name": "a"}]})
        self.assertEqual(out["containers"][1], {"name": "b", "image": "z"})
        self.assertEqual(len(out["containers"]), 2)

    def test_json_patch(self):
        doc = {"a": [1, 2], "b": {"c": 1}}
        out = patch.json_patch(doc, [{"op": "add", "path": "/a/-", "value": 3},
                                     {"op": "remove", "path": "/b/c"},
                                     {"op": "replace", "path": "/a/0", "value": 0}])
        self.assertEqual(out, {"a": [0, 2, 3], "b": {}})

    def test_selectors_and_jsonpath(self):
        reqs = parse_label_selector("a=1,b!=2,c in (x,y),!d,e")
        self.assertTrue(match_labels(reqs, {"a": "1", "c": "x", "e": ""}))
        self.assertFalse(match_labels(reqs, {"a": "1", "c": "x", "e": "", "d": "z"}))
        obj = {"status": {"conditions": [{"type": "A", "status": "False"},
                                         {"type": "Ready", "status": "True"}]}}
        self.assertEqual(tables.jsonpath(obj, '.status.conditions[?(@.type=="Ready")].status'),
                         "True")
        self.assertIsNone(tables.jsonpath(obj, ".status.phase"))


class ScaleTest(unittest.TestCase):
    """scale.py without a server: the Scale of an object and a Scale written back."""
    RT = type("RT", (), {"scale": {"specReplicasPath": ".spec.size.replicas",
                                   "statusReplicasPath": ".status.replicas"}})()

    def test_of_and_apply(self):
        obj = {"metadata": {"name": "a", "namespace": "n", "uid": "u", "resourceVersion": "7",
                            "generation": 3, "labels": {"x": "y"}}, "spec": {"size": {"replicas": 2}}}
        sc = scale.of(self.RT, obj)
        self.assertEqual(sc["metadata"], {"name": "a", "namespace": "n", "uid": "u", "resourceVersion": "7"})
        self.assertEqual((sc["spec"], sc["status"]), ({"replicas": 2}, {"replicas": 0}))   # no selector path
        out = scale.apply(self.RT, obj, {"spec": {"replicas": 5}, "metadata": {"resourceVersion": "6"}}, "a")
        self.assertEqual((out["spec"]["size"]["replicas"], out["metadata"]["resourceVersion"]), (5, "6"))
        self.assertEqual(scale.apply(self.RT, {"metadata": {}, "spec": {"size": {"replicas": 2}}}, {"spec": {}},
                                     "a")["spec"]["size"]["replicas"], 0)   # omitempty: absent is 0

    def test_refusals(self):
        for obj, sc, text in (({"metadata": {}}, {"spec": {}}, 'field ".spec.size.replicas" cannot be empty'),
                              ({"metadata": {}}, {"spec": {"replicas": "3"}}, "cannot unmarshal string"),
                              ({"metadata": {}}, {"spec": {"replicas": 2**31}}, "cannot unmarshal number"),
                              ({"metadata": {}}, {"metadata": {"name": "b"}, "spec": {"replicas": 1}},
                               "does not match the name on the URL (a)"),
                              ({"metadata": {}}, {"kind": "Pod"}, "wrong object passed to Scale update")):
            with self.assertRaises(errors.ApiError) as e:
                scale.apply(self.RT, obj, sc, "a")
            self.assertEqual(e.exception.code, 400)
            self.assertIn(text, e.exception.message)


if __name__ == "__main__":
    unittest.main()
