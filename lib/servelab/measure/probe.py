"""Measure this machine's CPU for the roofline of the embedded CPU engine: numpy copy
bandwidth and float32 matmul FLOP/s (best of repeats)."""

from __future__ import annotations

import math
import os
from pathlib import Path
import time
from typing import Any

import numpy as np

from .runinfo import cpu_model


def _best_time_s(fn, seconds: float, min_repeats: int = 3) -> tuple[float, int]:
    """Best wall time of ``fn()`` over repeats filling about ``seconds``."""
    best = math.inf
    n = 0
    t_end = time.perf_counter() + seconds
    while n < min_repeats or time.perf_counter() < t_end:
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        best = min(best, dt)
        n += 1
        if n >= 1000:
            break
    return best, n


def measure_cpu_bandwidth(seconds: float = 2.0, array_bytes: int = 256 * 2**20,
                          matmul_n: int = 1024) -> dict[str, Any]:
    """Measure this machine's memory copy bandwidth and float32 matmul FLOP/s with numpy.

    Copy: ``np.copyto(dst, src)`` of ``array_bytes`` (default 256 MiB, far beyond any
    cache), best of as many repeats as fit in half of ``seconds``; bandwidth counts the
    bytes read plus the bytes written (``2 * array_bytes / t``, STREAM "Copy" convention;
    write-allocate traffic is not counted). Matmul: ``a @ b`` of two ``matmul_n`` square
    float32 matrices, best of repeats in the other half, ``2 n^3 / t``. numpy's BLAS may
    use several threads; the copy is single-threaded, so it understates what a
    multi-threaded engine can stream.

    Returns ``copy_bandwidth_Bps``, ``matmul_f32_flops``, ``array_bytes``, ``matmul_n``,
    ``copy_repeats``, ``matmul_repeats``, ``cpu_model``, ``cpu_count``.
    """
    if seconds <= 0:
        raise ValueError("seconds must be > 0")
    n_elems = max(1, int(array_bytes) // 8)
    src = np.ones(n_elems, dtype=np.float64)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # fault the pages in before timing
    t_copy, n_copy = _best_time_s(lambda: np.copyto(dst, src), seconds / 2)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((matmul_n, matmul_n), dtype=np.float32)
    b = rng.standard_normal((matmul_n, matmul_n), dtype=np.float32)
    a @ b  # warm the BLAS
    t_mm, n_mm = _best_time_s(lambda: a @ b, seconds / 2)
    return {
        "copy_bandwidth_Bps": 2 * src.nbytes / t_copy,
        "matmul_f32_flops": 2 * matmul_n**3 / t_mm,
        "array_bytes": int(src.nbytes),
        "matmul_n": int(matmul_n),
        "copy_repeats": n_copy,
        "matmul_repeats": n_mm,
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_signature": cpu_signature(),
    }


#: instruction-set features that change how fast the CPU engine computes in bf16
SIGNATURE_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile")


def cpu_signature() -> str | None:
    """Which CPU this is beyond its marketing name ("AMD EPYC" names several generations): vendor
    family and model numbers and the bf16-relevant instruction sets, from /proc/cpuinfo."""
    try:
        info = Path("/proc/cpuinfo").read_text().split("\n\n")[0]
    except OSError:
        return None
    kv = {}
    for line in info.splitlines():
        if ":" in line:
            k, v = line.split(":", 1)
            kv[k.strip()] = v.strip()
    flags = set(kv.get("flags", "").split())
    return (f"{kv.get('vendor_id', '?')} family {kv.get('cpu family', '?')} model {kv.get('model', '?')}; "
            + " ".join(f for f in SIGNATURE_FLAGS if f in flags))
