#!/usr/bin/env python3
"""Writes the seed corpora under tests/fuzz/corpus/<target>/ (committed; rerun to
regenerate, it is deterministic). Seeds are valid examples plus a few edge cases; the
fuzzers grow their own corpora elsewhere (see README.md). Each file stays small."""
import json
import os
import shutil
import struct
import sys
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CORPUS = os.path.join(HERE, "corpus")


def put(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---------------------------------------------------------------- config (YAML text)
def configs():
    with open(os.path.join(ROOT, "examples/local/tiny.yaml")) as f:
        put("config", "ok_tiny_example.yaml", f.read())
    put("config", "ok_empty.yaml", "")
    put("config", "ok_full.yaml", """model: {preset: custom, vocabSize: 512, dim: 64, layers: 2, heads: 4, ffnDim: 128,
  ropeTheta: 10000.0, normEps: 1.0e-5, initStd: 0.02}
data: {train: a.bin, val: "", seqLen: 16, batchSize: 2, valBatches: 0, valEvery: 0}
training: {steps: 10, tokens: 0, seed: 18446744073709551615, lr: 0.01, minLr: 0.001, lrWarmupSteps: 0,
  weightDecay: 0, beta1: 0, beta2: 0.99, eps: 1e-8, gradClip: 0, logEvery: 1}
algorithm:
  mode: a-edit
  syncInterval: 1
  syncSeconds: 0.5
  minStepsPerSync: 0
  maxStepsPerSync: 0
  warmupSteps: 0
  outer: {lr: 1, momentum: 0, nesterov: off}
  penalty: {anomaly: yes, emaAlpha: 0.5, zThreshold: 1e-3, anomalyWarmup: 0, weighted: false,
    temperature: 1e300, clip: no, clipNorm: 1, stepShare: 1}
  prefetch: false
  offloadOuterState: true
  syncCompression: int8
  compressionBlock: 16
checkpoint: {dir: /tmp/c, everySteps: 1, keep: 1000, resume: false}
metrics: {host: 0.0.0.0, port: 0}
telemetry: {addr: "op.edit-system.svc:9443", token: s3cret, everySteps: 1}
debug:
  injectStepDelay: {rank: 0, seconds: 3600, random: true}
  corruptReplica: {replica: 1, atSync: 1, scale: 0, nan: true}
runtime: {threads: 4096, collectiveTimeoutSeconds: 1e-9, backend: gloo}
""")
    put("config", "edge_int_as_float.yaml", "training:\n  steps: 1e6\n  tokens: 2.0e3\n")
    put("config", "edge_anchor_alias.yaml", "data: &d {seqLen: 8}\nmodel:\n  <<: *d\n")
    put("config", "edge_null_section.yaml", "debug:\nalgorithm:\n  penalty:\n")
    put("config", "bad_duplicate_key.yaml", "model:\n  dim: 64\n  dim: 128\n")
    put("config", "bad_nan.yaml", "training:\n  lr: .nan\n  beta1: -.inf\n")
    put("config", "bad_list_value.yaml", "data:\n  seqLen: [1, 2]\n")
    put("config", "bad_int_overflow.yaml", "data:\n  seqLen: 99999999999999999999999\n")
    put("config", "bad_tab_indent.yaml", "model:\n\tdim: 5\n")
    put("config", "bad_deep_nesting.yaml", "a: " + "[" * 200 + "]" * 200 + "\n")
    put("config", "bad_binary.yaml", bytes(range(256)))
    put("config", "bad_nonscalar_key.yaml", "? [a, b]\n: 1\n")
    # The same bytes are also tried as --set assignments, one per line.
    put("config", "set_overrides.txt", "algorithm.mode=a-edit\nalgorithm.syncSeconds=2\nmodel.preset=small\n"
                                       "debug.injectStepDelay.rank=3\nalgorithm.penalty=1\n")


# ---------------------------------------------------------------- editjob (JSON objects)
def editjobs():
    try:
        import yaml  # python3-yaml (install-deps.sh)
        with open(os.path.join(ROOT, "examples/cluster/editjob-aedit.yaml")) as f:
            tiny = yaml.safe_load(f)
    except ImportError:
        tiny = {"apiVersion": "edit.io/v1alpha1", "kind": "EDiTJob", "metadata": {"name": "tiny"},
                "spec": {"replicas": 2, "shardsPerReplica": 2, "image": "ghcr.io/example/edit-runtime:latest"}}
    put("editjob", "ok_tiny_example.json", json.dumps(tiny, indent=1))
    minimal = {"apiVersion": "edit.io/v1alpha1", "kind": "EDiTJob", "metadata": {"name": "j"},
               "spec": {"image": "img"}}
    put("editjob", "ok_minimal.json", json.dumps(minimal))
    full = {"apiVersion": "edit.io/v1alpha1", "kind": "EDiTJob",
            "metadata": {"name": "full", "namespace": "ns", "uid": "u", "generation": 3, "resourceVersion": "7"},
            "spec": {"replicas": 4, "shardsPerReplica": 2, "gpusPerWorker": 1, "image": "img",
                     "imagePullPolicy": "IfNotPresent", "command": ["edit-train"], "args": ["--x"],
                     "resources": {"limits": {"cpu": "2"}}, "env": [{"name": "A", "value": "b"}],
                     "nodeSelector": {"k": "v"}, "tolerations": [{"operator": "Exists"}],
                     "priorityClassName": "p", "schedulerName": "s", "serviceAccountName": "sa",
                     "volumes": [{"name": "d", "emptyDir": {}}], "volumeMounts": [{"name": "d", "mountPath": "/d"}],
                     "masterPort": 29500, "hangTimeoutSeconds": 0,
                     "model": {"preset": "tiny"}, "data": {"seqLen": 8, "batchSize": 1},
                     "training": {"steps": 0}, "algorithm": {"mode": "a-edit", "syncInterval": 1, "syncSeconds": 2},
                     "checkpoint": {"everySteps": 0}, "debug": {},
                     "runPolicy": {"backoffLimit": 0, "activeDeadlineSeconds": 1, "ttlSecondsAfterFinished": 0,
                                   "cleanPodPolicy": "All", "suspend": True},
                     "stragglerPolicy": {"threshold": 100, "windowSteps": 10000, "action": "Replace",
                                         "minReports": 1}}}
    put("editjob", "ok_full.json", json.dumps(full))

    def bad(name, **spec):
        o = json.loads(json.dumps(minimal))
        o["spec"].update(spec)
        put("editjob", name, json.dumps(o))
    bad("bad_replicas_zero.json", replicas=0)
    bad("bad_replicas_string.json", replicas="2")
    bad("bad_replicas_fraction.json", replicas=1.5)
    bad("bad_world_too_large.json", replicas=4096, shardsPerReplica=1024)
    bad("bad_negative_shards.json", shardsPerReplica=-1)
    bad("bad_mode.json", algorithm={"mode": "fast"})
    bad("bad_mode_type.json", algorithm={"mode": 7})
    bad("bad_env_no_name.json", env=[{"value": "x"}])
    bad("bad_command_empty.json", command=[])
    bad("bad_command_type.json", command=["a", 1])
    bad("bad_pull_policy.json", imagePullPolicy="Sometimes")
    bad("bad_straggler_threshold.json", stragglerPolicy={"threshold": 0.5})
    bad("bad_run_policy_type.json", runPolicy=[])
    bad("bad_port.json", masterPort=70000)
    bad("edge_image_over_crd_max.json", image="x" * 3000)  # CRD maxLength 512; parseSpec does not check (README, known bug 7)
    put("editjob", "bad_spec_missing.json", json.dumps({"metadata": {"name": "x"}}))
    put("editjob", "bad_spec_array.json", json.dumps({"spec": []}))
    put("editjob", "bad_name_long.json", json.dumps({"metadata": {"name": "a" * 60}, "spec": {"image": "i", "replicas": 100}}))
    put("editjob", "bad_name_upper.json", json.dumps({"metadata": {"name": "Bad_Name"}, "spec": {"image": "i"}}))
    put("editjob", "edge_not_object.json", "[1, 2, 3]")
    put("editjob", "edge_truncated.json", json.dumps(minimal)[:-3])


# ---------------------------------------------------------------- token files
def tokenfiles():
    def llmc(magic, version, count, body):
        return struct.pack("<3i", magic, version, count) + b"\0" * (1024 - 12) + body
    toks = list(range(1, 41))
    u16 = struct.pack("<%dH" % len(toks), *toks)
    u32 = struct.pack("<%dI" % len(toks), *[t * 70000 for t in toks])
    put("tokenfile", "ok_llmc_u16.bin", llmc(20240520, 1, len(toks), u16))
    put("tokenfile", "ok_llmc_u32.bin", llmc(20240801, 7, len(toks), u32))
    put("tokenfile", "ok_nanogpt.bin", "The quick brown fox jumps over the lazy dog.".encode()[:44])
    put("tokenfile", "ok_nanogpt_two_tokens.bin", struct.pack("<2H", 65535, 0))
    put("tokenfile", "ok_empty.bin", b"")
    put("tokenfile", "bad_truncated_header.bin", struct.pack("<3i", 20240520, 1, 5) + b"\0" * 100)
    put("tokenfile", "bad_truncated_body.bin", llmc(20240520, 1, 40, u16[:-10]))
    put("tokenfile", "bad_trailing_bytes.bin", llmc(20240801, 7, 40, u32 + b"\0\0\0\0"))
    put("tokenfile", "bad_version.bin", llmc(20240520, 7, 40, u16))
    put("tokenfile", "bad_negative_count.bin", llmc(20240801, 7, -1, u32))
    put("tokenfile", "bad_unknown_magic.bin", llmc(12345, 1, 40, u16))
    put("tokenfile", "bad_odd_size.bin", b"abc")
    put("tokenfile", "bad_u32_odd_body.bin", llmc(20240801, 7, 1, b"\1\2\3\4\5\6"))


# ---------------------------------------------------------------- checkpoint files
# Layout (runtime/src/train/checkpoint.cpp): "EDITCKP1", u32 count, per tensor: u32 name length,
# name, i32 c10::ScalarType (4 Long, 6 Float, 7 Double), u32 dim, i64 sizes[dim],
# u64 nbytes, data; then CRC-32 (zlib's) of everything before it.
LONG, FLOAT, DOUBLE = 4, 6, 7


def tensor(name, stype, sizes, data=None, nbytes=None):
    n = 1
    for s in sizes:
        n *= s
    width = 4 if stype == FLOAT else 8
    if data is None:
        fmt = {FLOAT: "f", DOUBLE: "d", LONG: "q"}[stype]
        data = struct.pack("<%d%s" % (n, fmt), *[(i * 0.5 if stype != LONG else i) for i in range(n)])
    b = name.encode()
    return (struct.pack("<I", len(b)) + b + struct.pack("<iI", stype, len(sizes)) +
            b"".join(struct.pack("<q", s) for s in sizes) +
            struct.pack("<Q", n * width if nbytes is None else nbytes) + data)


def ckpt(tensors, count=None, crc=True):
    body = b"EDITCKP1" + struct.pack("<I", len(tensors) if count is None else count) + b"".join(tensors)
    return body + struct.pack("<I", zlib.crc32(body) if crc else 0xDEADBEEF)


def checkpoints():
    good = [tensor("inner.w", FLOAT, [2, 3]), tensor("outer.m", DOUBLE, [4]), tensor("step", LONG, [])]
    full = ckpt(good)
    put("checkpoint", "ok_three_tensors.ckpt", full)
    put("checkpoint", "ok_no_tensors.ckpt", ckpt([]))
    put("checkpoint", "ok_rank8.ckpt", ckpt([tensor("r8", FLOAT, [1] * 8)]))
    put("checkpoint", "bad_truncated.ckpt", full[:len(full) // 2])
    put("checkpoint", "bad_checksum.ckpt", full[:-4] + b"\0\0\0\0")
    put("checkpoint", "bad_magic.ckpt", b"EDITCKP2" + full[8:])
    put("checkpoint", "bad_tiny.ckpt", b"EDITCKP1")
    put("checkpoint", "bad_dtype.ckpt", ckpt([tensor("h", 5, [2], data=b"\0" * 4, nbytes=4)]))
    put("checkpoint", "bad_rank9.ckpt", ckpt([tensor("r9", FLOAT, [1] * 9)]))
    put("checkpoint", "bad_negative_size.ckpt", ckpt([tensor("n", FLOAT, [-1], data=b"", nbytes=0)]))
    put("checkpoint", "bad_nbytes_mismatch.ckpt", ckpt([tensor("m", FLOAT, [2], data=b"\0" * 8, nbytes=12)]))
    put("checkpoint", "bad_count_too_high.ckpt", ckpt(good, count=9))
    put("checkpoint", "bad_name_past_end.ckpt", ckpt([struct.pack("<I", 1 << 30) + b"abc"]))
    put("checkpoint", "bad_data_short.ckpt", ckpt([tensor("s", DOUBLE, [4], data=b"\0" * 8)]))


def known_bugs():
    """Reproducers of the bugs in README.md "Known bugs": kept out of corpus/ so that the
    CI fuzz runs and the replay tests pass; the DISABLED_ KnownBugs tests replay them."""
    def kb(target, name, data):
        d = os.path.join(HERE, "known-bugs", target)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, name), "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
    kb("editjob", "float_cast_overflow_replicas.json", '{"spec":{"image":"i","replicas":1e300}}')
    kb("editjob", "int_truncation_replicas.json", '{"spec":{"image":"i","replicas":4294967297}}')
    kb("checkpoint", "huge_tensor_allocated_before_size_check.ckpt",
       ckpt([tensor("w", FLOAT, [1 << 40], data=b"", nbytes=0)]))
    kb("checkpoint", "numel_overflow.ckpt", ckpt([tensor("w", DOUBLE, [1 << 62, 1 << 62], data=b"", nbytes=0)]))
    kb("checkpoint", "empty_tensor_memcpy_null.ckpt", ckpt([tensor("empty", FLOAT, [0, 5])]))


def manifests():
    ok = "edit-checkpoint v1\nstep 120\nworld 2\nrank 0 crc32 12345\nrank 1 crc32 4294967295\nconfig\nmodel:\n  dim: 8\n"
    put("manifest", "ok_two_ranks", ok)
    put("manifest", "ok_no_config", "edit-checkpoint v1\nstep 0\nworld 1\nrank 0 crc32 0\n")
    put("manifest", "bad_format", "edit-checkpoint v2\nstep 1\nworld 1\nrank 0 crc32 0\n")
    put("manifest", "bad_ranks_out_of_order", "edit-checkpoint v1\nstep 1\nworld 2\nrank 1 crc32 0\nrank 0 crc32 0\n")
    put("manifest", "bad_world_mismatch", "edit-checkpoint v1\nstep 1\nworld 3\nrank 0 crc32 0\n")
    put("manifest", "bad_world_zero", "edit-checkpoint v1\nstep 1\nworld 0\n")
    put("manifest", "bad_negative_rank", "edit-checkpoint v1\nworld 1\nrank -1 crc32 0\n")
    put("manifest", "bad_empty", "")
    put("manifest", "edge_huge_numbers", "edit-checkpoint v1\nstep 99999999999999999999999\nworld 99999999999\n")


if __name__ == "__main__":
    if "--clean" in sys.argv:
        for t in ("config", "editjob", "tokenfile", "checkpoint", "manifest"):
            shutil.rmtree(os.path.join(CORPUS, t), ignore_errors=True)
    configs()
    editjobs()
    tokenfiles()
    checkpoints()
    manifests()
    known_bugs()
