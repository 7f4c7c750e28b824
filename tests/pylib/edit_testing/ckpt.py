"""An independent reader of edit-train checkpoint files (runtime/src/train/checkpoint.h),
and the checks built on it."""
import glob
import math
import os
import struct
import zlib

DTYPES = {6: ("f", 4), 7: ("d", 8), 4: ("q", 8)}  # c10::ScalarType codes: Float, Double, Long


def read(path):
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"EDITCKP1", f"{path}: bad magic"
    (crc,) = struct.unpack_from("<I", data, len(data) - 4)
    assert zlib.crc32(data[:-4]) == crc, f"{path}: checksum mismatch"
    off = 8
    (n,) = struct.unpack_from("<I", data, off)
    off += 4
    out = {}
    for _ in range(n):
        (ln,) = struct.unpack_from("<I", data, off)
        off += 4
        name = data[off:off + ln].decode()
        off += ln
        dtype, dim = struct.unpack_from("<iI", data, off)
        off += 8
        sizes = struct.unpack_from(f"<{dim}q", data, off)
        off += 8 * dim
        (nbytes,) = struct.unpack_from("<Q", data, off)
        off += 8
        out[name] = data[off:off + nbytes]  # raw bytes: compared bit for bit
        off += nbytes
    return out


def values(raw, code="f"):
    return struct.unpack(f"<{len(raw) // struct.calcsize(code)}{code}", raw)


def checkpoints(ckpt_dir):
    """Complete checkpoints (with MANIFEST), oldest first, as (step, path)."""
    out = []
    for d in glob.glob(os.path.join(ckpt_dir, "step-*")):
        if os.path.exists(os.path.join(d, "MANIFEST")):
            out.append((int(os.path.basename(d)[5:]), d))
    return sorted(out)


def outer_weights_finite(step_dir, world):
    """Reads every rank file of a checkpoint; (True, "") when every outer/theta value is
    finite, else (False, where the first bad one is)."""
    for r in range(world):
        f = read(os.path.join(step_dir, "rank-%05d.ckpt" % r))
        for k, v in f.items():
            if k.endswith("/outer") or k.endswith("/theta"):
                bad = sum(1 for x in values(v) if not math.isfinite(x))
                if bad:
                    return False, "%s rank %d %s: %d non-finite values" % (step_dir, r, k, bad)
    return True, ""
