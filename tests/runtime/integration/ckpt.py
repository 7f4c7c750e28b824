"""An independent reader of edit-train checkpoint files (runtime/src/train/checkpoint.h)."""
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
