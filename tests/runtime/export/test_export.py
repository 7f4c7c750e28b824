"""edit-export end to end, after a real run: the tiny preset trained in 2 x 2 by edit-run.

ExportCli (any python3, stdlib only): the files (an independent header parse), the round
trip (the exported file's validation loss is edit-run's), the choice of weights, and the
refusals (existing output, corrupt or incomplete checkpoints, no outer weights).

HfReference (Debian's /usr/bin/python3 with python3-torch; exits 77, "skipped", without
torch): hf_reference.py, a Llama written from Hugging Face's conventions, reproduces the
project's logits within 1e-4 from the exported files alone, and notices when RoPE's or
the MLP's convention is broken on purpose.
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

from edit_testing import edit_run
from edit_testing.data import make_data
from edit_testing.logs import summaries
from edit_testing.paths import EDIT_EXPORT

HERE = os.path.dirname(os.path.abspath(__file__))
REFERENCE = os.path.join(HERE, "hf_reference.py")
DTYPE_SIZE = {"F32": 4, "BF16": 2, "I64": 8}


def train(d):
    """tiny (d=128, 4 layers) in 2 x 2 for 24 steps: warm-up to 8, a sync every 4 steps.
    Checkpoints every 5 steps: step 5 is in the warm-up (no outer weights), step 10 two
    local steps after a sync (replicas differ), step 24 the final, synchronized model."""
    logs = os.path.join(d, "logs")
    sets = ["model.preset=tiny", f"data.train={d}/train.bin", f"data.val={d}/val.bin",
            "data.valBatches=4", "training.steps=24", "training.lrWarmupSteps=4",
            "training.logEvery=8", "algorithm.warmupSteps=8", "algorithm.syncInterval=4",
            "algorithm.penalty.anomalyWarmup=2", f"checkpoint.dir={d}/ckpt",
            "checkpoint.everySteps=5", "checkpoint.keep=100"]
    p = edit_run.run(4, sets, shards=2, log_dir=logs, quiet=True)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return summaries(logs)


def export(*args, ok=True):
    p = subprocess.run([EDIT_EXPORT, "--threads", "1", *args], capture_output=True, text=True, timeout=600)
    if ok:
        assert p.returncode == 0, f"edit-export {' '.join(args)}: rc {p.returncode}\n{p.stderr}"
    report = None
    for line in p.stdout.splitlines():
        if line.startswith("@edit-export "):
            report = json.loads(line[len("@edit-export "):])
    return p, report


def header(path):
    """An independent parse of a safetensors header: (header length, header, data bytes)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack_from("<Q", data, 0)
    return n, json.loads(data[8:8 + n]), data[8 + n:]


def hf_names(config):
    names = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
    for layer in range(config["num_hidden_layers"]):
        for n in ("input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                  "self_attn.o_proj", "post_attention_layernorm", "mlp.gate_proj", "mlp.up_proj",
                  "mlp.down_proj"):
            names.add(f"model.layers.{layer}.{n}.weight")
    return names


class Trained(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="edit-export-test-")
        cls.d = cls.tmp.name
        make_data(cls.d)
        cls.summaries = train(cls.d)
        cls.ckpt = os.path.join(cls.d, "ckpt")

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def out(self, name):
        return os.path.join(self.d, "out", name)


class ExportCli(Trained):
    def test_files_and_round_trip(self):
        out = self.out("f32")
        _, r = export("--checkpoint", self.ckpt, "--out", out, "--eval")
        self.assertEqual((r["weights"], r["step"], r["mesh"], r["dtype"]), ("outer", "24", "2x2", "f32"))
        config = json.load(open(os.path.join(out, "config.json")))
        self.assertEqual(config["architectures"], ["LlamaForCausalLM"])
        self.assertEqual((config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"],
                          config["intermediate_size"], config["vocab_size"]), (128, 4, 4, 352, 256))
        n, h, data = header(os.path.join(out, "model.safetensors"))
        self.assertEqual(n % 8, 0)
        meta = h.pop("__metadata__")
        self.assertEqual(meta["format"], "pt")
        self.assertEqual(set(h), hf_names(config))
        spans = sorted((e["data_offsets"][0], e["data_offsets"][1], k) for k, e in h.items())
        pos = 0
        for begin, end, k in spans:
            e = h[k]
            self.assertEqual(e["dtype"], "F32", k)
            self.assertEqual(begin, pos, f"{k}: gap or overlap")
            count = 1
            for s in e["shape"]:
                count *= s
            self.assertEqual(end - begin, 4 * count, k)
            pos = end
        self.assertEqual(pos, len(data))

        # Round trip: the exported file, read back, gives edit-run's validation loss
        # (the same batches: 4 ranks' streams x valBatches), and the checkpoint's exactly.
        want = self.summaries[0]["val_loss"]
        _, back = export("--model", out, "--eval")
        self.assertAlmostEqual(back["val_loss"], want, delta=1e-5 * abs(want))
        self.assertEqual(back["val_loss"], r["val_loss"])

        # bf16: half the bytes, BF16 everywhere, the loss moves by rounding only.
        out16 = self.out("bf16")
        export("--checkpoint", self.ckpt, "--out", out16, "--dtype", "bf16")
        n16, h16, data16 = header(os.path.join(out16, "model.safetensors"))
        h16.pop("__metadata__")
        self.assertEqual({e["dtype"] for e in h16.values()}, {"BF16"})
        self.assertEqual(len(data16) * 2, len(data))
        self.assertEqual(json.load(open(os.path.join(out16, "config.json")))["torch_dtype"], "bfloat16")
        _, b16 = export("--model", out16, "--eval")
        self.assertNotEqual(b16["val_loss"], want)
        self.assertAlmostEqual(b16["val_loss"], want, delta=0.01 * want)

    def test_weight_selection(self):
        # Two local steps after a sync, the replicas and the outer weights all differ.
        step10 = {}
        for w, rep in (("outer", "0"), ("replica", "0"), ("replica", "1")):
            out = self.out(f"s10-{w}-{rep}")
            _, r = export("--checkpoint", self.ckpt, "--step", "10", "--weights", w, "--replica", rep,
                          "--out", out, "--eval")
            self.assertEqual((r["weights"], r["replica"], r["step"]), (w, rep, "10"))
            step10[(w, rep)] = (header(os.path.join(out, "model.safetensors"))[2], r["val_loss"])
        datas = [v[0] for v in step10.values()]
        self.assertEqual(len(set(datas)), 3, "outer, replica 0 and replica 1 must differ at step 10")
        # After the final sync every replica holds the outer weights: identical tensors.
        final = set()
        for w, rep in (("outer", "1"), ("replica", "0"), ("replica", "1")):
            out = self.out(f"s24-{w}-{rep}")
            export("--checkpoint", self.ckpt, "--weights", w, "--replica", rep, "--out", out)
            final.add(header(os.path.join(out, "model.safetensors"))[2])
        self.assertEqual(len(final), 1)
        # The warm-up checkpoint has no outer weights: auto takes the replica's, outer is refused.
        _, r = export("--checkpoint", self.ckpt, "--step", "5", "--out", self.out("s5"))
        self.assertEqual(r["weights"], "replica")
        p, _ = export("--checkpoint", self.ckpt, "--step", "5", "--weights", "outer", "--out",
                      self.out("s5-outer"), ok=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("no outer weights", p.stderr)
        self.assertFalse(os.path.exists(self.out("s5-outer")))

    def test_refusals(self):
        out = self.out("existing")
        export("--checkpoint", self.ckpt, "--out", out)
        before = open(os.path.join(out, "model.safetensors"), "rb").read()
        p, _ = export("--checkpoint", self.ckpt, "--step", "10", "--out", out, ok=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("exists; pass --force", p.stderr)
        self.assertEqual(open(os.path.join(out, "model.safetensors"), "rb").read(), before)
        # A killed earlier attempt's temporary directory (its process is gone) is cleaned up.
        dead = subprocess.Popen(["true"])
        dead.wait()
        stale = os.path.join(os.path.dirname(out), f".existing.export-tmp-{dead.pid}")
        os.makedirs(stale)
        report = os.path.join(self.d, "report.json")
        export("--checkpoint", self.ckpt, "--step", "10", "--out", out, "--force", "--report", report)
        self.assertFalse(os.path.exists(stale))
        r = json.load(open(report))
        self.assertEqual((r["out"], r["step"], r["weights"]), (out, "10", "outer"))
        self.assertNotEqual(open(os.path.join(out, "model.safetensors"), "rb").read(), before)
        left = [e for e in os.listdir(os.path.dirname(out)) if e.startswith(".")]
        self.assertEqual(left, [], "temporary or old directories left behind")

        # Corrupt and incomplete copies of the final checkpoint.
        def broken(name, damage):
            c = os.path.join(self.d, "broken-" + name)
            shutil.copytree(os.path.join(self.ckpt, "step-00000024"), c)
            damage(c)
            p, _ = export("--checkpoint", c, "--out", self.out("broken-" + name), ok=False)
            self.assertEqual(p.returncode, 2, p.stderr)
            self.assertFalse(os.path.exists(self.out("broken-" + name)))
            return p.stderr

        def flip(c):
            path = os.path.join(c, "rank-00001.ckpt")
            b = bytearray(open(path, "rb").read())
            b[len(b) // 2] ^= 0x01
            open(path, "wb").write(bytes(b))
        err = broken("flip", flip)
        self.assertIn("rank-00001.ckpt: checksum mismatch", err)
        p, _ = export("--checkpoint", os.path.join(self.d, "broken-flip"), "--out", self.out("y"),
                      "--report", report, ok=False)
        r = json.load(open(report))
        self.assertEqual(r["exit_code"], 2)
        self.assertIn("rank-00001.ckpt: checksum mismatch", r["error"])
        err = broken("manifest", lambda c: os.remove(os.path.join(c, "MANIFEST")))
        self.assertIn("no complete checkpoint", err)
        err = broken("rank3", lambda c: os.remove(os.path.join(c, "rank-00003.ckpt")))
        self.assertIn("rank-00003.ckpt: missing", err)

        def swap(c):  # intact files, but not the ones the manifest lists
            shutil.copy(os.path.join(self.ckpt, "step-00000020", "rank-00000.ckpt"), os.path.join(c, "rank-00000.ckpt"))
        err = broken("swapped", swap)
        self.assertIn("does not match the checksum", err)

        p, _ = export("--checkpoint", self.ckpt, "--out", self.ckpt, "--force", ok=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("would contain", p.stderr)
        self.assertTrue(os.path.exists(os.path.join(self.ckpt, "step-00000024", "MANIFEST")))
        p, _ = export("--checkpoint", self.ckpt, "--dtype", "f8", "--out", self.out("x"), ok=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("--dtype: expected f32 or bf16", p.stderr)


class HfReference(Trained):
    def reference(self, model, logits):
        p = subprocess.run([sys.executable, REFERENCE, "--model", model, "--logits", logits],
                           capture_output=True, text=True, timeout=600)
        return p.returncode, json.loads(p.stdout.strip().splitlines()[-1]) if p.stdout.strip() else p.stderr

    def test_independent_forward_matches(self):
        val = os.path.join(self.d, "val.bin")
        out = self.out("f32")
        logits = os.path.join(self.d, "logits-f32.safetensors")
        export("--checkpoint", self.ckpt, "--out", out, "--dump-logits", logits, "--val", val)
        rc, r = self.reference(out, logits)
        self.assertEqual(rc, 0, r)
        self.assertLess(r["max_abs_diff"], 1e-4)
        self.assertEqual(r["shape"], [8, 128, 256])
        self.assertAlmostEqual(r["loss_reference"], r["loss_project"], delta=1e-5)
        print(f"\nf32: max |logits difference| {r['max_abs_diff']:.3g}, loss {r['loss_reference']:.6f}")

        # bf16: the project's logits on the bf16 file's weights, against the reference.
        out16 = self.out("bf16")
        logits16 = os.path.join(self.d, "logits-bf16.safetensors")
        export("--checkpoint", self.ckpt, "--out", out16, "--dtype", "bf16")
        export("--model", out16, "--dump-logits", logits16, "--val", val)
        rc, r16 = self.reference(out16, logits16)
        self.assertEqual(rc, 0, r16)
        self.assertEqual(r16["dtypes"], ["torch.bfloat16"])
        print(f"bf16: max |logits difference| {r16['max_abs_diff']:.3g}, loss {r16['loss_reference']:.6f}")

    def test_reference_catches_broken_conventions(self):
        """The check has teeth: Meta's interleaved RoPE row order in q_proj/k_proj (what
        HF's conversion script permutes away), or gate and up swapped, must fail it."""
        val = os.path.join(self.d, "val.bin")
        out = self.out("good")
        logits = os.path.join(self.d, "logits.safetensors")
        export("--checkpoint", self.ckpt, "--out", out, "--dump-logits", logits, "--val", val)
        config = json.load(open(os.path.join(out, "config.json")))
        hd = config["hidden_size"] // config["num_attention_heads"]
        row = config["hidden_size"] * 4

        def rewrite(name, mutate):
            bad = self.out(name)
            shutil.copytree(out, bad)
            path = os.path.join(bad, "model.safetensors")
            data = bytearray(open(path, "rb").read())
            n, h, _ = header(path)
            mutate(data, h, 8 + n)
            open(path, "wb").write(bytes(data))
            return bad

        def interleave(data, h, base):
            # Row j of each head goes where Meta's layout keeps it: halves -> pairs.
            for l in range(config["num_hidden_layers"]):
                for proj in ("q_proj", "k_proj"):
                    begin, end = h[f"model.layers.{l}.self_attn.{proj}.weight"]["data_offsets"]
                    rows = [data[base + begin + i * row:base + begin + (i + 1) * row]
                            for i in range((end - begin) // row)]
                    out_rows = []
                    for head in range(len(rows) // hd):
                        r = rows[head * hd:(head + 1) * hd]
                        for i in range(hd // 2):
                            out_rows += [r[i], r[i + hd // 2]]
                    data[base + begin:base + end] = b"".join(out_rows)

        def swap_gate_up(data, h, base):
            for l in range(config["num_hidden_layers"]):
                g = h[f"model.layers.{l}.mlp.gate_proj.weight"]["data_offsets"]
                u = h[f"model.layers.{l}.mlp.up_proj.weight"]["data_offsets"]
                gb, ub = data[base + g[0]:base + g[1]], data[base + u[0]:base + u[1]]
                data[base + g[0]:base + g[1]], data[base + u[0]:base + u[1]] = ub, gb

        for name, mutate in (("interleaved-rope", interleave), ("gate-up-swapped", swap_gate_up)):
            rc, r = self.reference(rewrite(name, mutate), logits)
            self.assertEqual(rc, 1, f"{name}: the reference did not notice: {r}")
            self.assertGreater(r["max_abs_diff"], 1e-2, name)


if __name__ == "__main__":
    if any(a.startswith("HfReference") for a in sys.argv[1:]):
        try:
            import torch  # noqa: F401
        except ImportError:
            print(f"SKIP: {sys.executable} has no torch (apt-get install python3-torch)")
            sys.exit(77)
    unittest.main()
