"""What the runtime decides from this CPU, for tests and benchmarks to expect or copy."""


def cpu_flags():
    """The flags of /proc/cpuinfo's first processor (an empty set where it cannot be read)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def openblas_coretype():
    """The OPENBLAS_CORETYPE edit-train sets for itself on this CPU (runtime/src/bin/blas_env.h:
    Debian's OpenBLAS 0.3.21 would pick its SSE3 Prescott kernels on recent Xeons), None
    where it sets none."""
    flags = cpu_flags()
    if "avx512_bf16" in flags:
        return "Cooperlake"
    if {"avx512f", "avx512bw", "avx512vl"} <= flags:
        return "SkylakeX"
    if {"avx2", "fma"} <= flags:
        return "Haswell"
    return None
