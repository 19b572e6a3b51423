"""Micro-benchmarks of the machine an engine runs on, with torch (CUDA on a GPU machine, else the
CPU): the numbers the performance model (`analysis.perfmodel`) takes instead of datasheet peaks.

- copy bandwidth: a device-to-device copy of a large buffer (bytes read + written over time);
- decode-like bandwidth: `F.linear` of a [B, K] activation through a stack of bf16 weight matrices
  much larger than the caches (as one decode step reads every layer's weights once), for B = 1, 8, 32:
  weight bytes over time;
- GEMM throughput: bf16 (and fp8 on a GPU that has `torch._scaled_mm`) [M, K] x [K, N] at
  prefill-like M = 256, 1024, 4096 (FLOP/s);
- launch cost: the time of one tiny kernel launched eagerly and replayed in a CUDA graph.

Each figure is the best of a few timed repeats after a warm-up (the machine's capability, not its
noise). No engine, no I/O: the caller (`servelab calibrate-hw`) stores the result. Not for the
model (`analysis.perfmodel`) nor the engine sweep (`calibrate_hw`).
"""

from __future__ import annotations

import platform
import time
from typing import Any, Callable

from ..engines.base import usable_cores
from .runinfo import cpu_model

DECODE_BATCHES = (1, 8, 32)
PREFILL_M = (256, 1024, 4096)


def _timer(torch: Any, dev: str) -> Callable[[Callable[[], Any], int], float]:
    def best(fn: Callable[[], Any], repeats: int) -> float:
        fn()  # warm-up (allocations, kernel selection)
        out = []
        for _ in range(repeats):
            if dev == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            if dev == "cuda":
                torch.cuda.synchronize()
            out.append(time.perf_counter() - t0)
        return min(out)
    return best


def machine(torch: Any, dev: str) -> dict[str, Any]:
    """What the numbers were measured on: the GPU's name and memory, or the CPU's model and cores."""
    if dev == "cuda":
        p = torch.cuda.get_device_properties(0)
        return {"kind": "gpu", "name": p.name, "memory_bytes": int(p.total_memory), "count": torch.cuda.device_count(),
                "torch": torch.__version__, "cuda": torch.version.cuda}
    return {"kind": "cpu", "name": cpu_model() or platform.processor() or "unknown CPU",
            "cores": usable_cores(),
            "torch": torch.__version__}


def _copy(torch: Any, dev: str, best: Any, reps: int, quick: bool) -> float:
    """Read + write bandwidth of a copy of a buffer far larger than the last-level cache."""
    gpu = dev == "cuda"
    n = (2**24 if quick else (2**31 if gpu else 2**28)) // 2  # bf16 elements: 2 GiB on a GPU, 256 MiB on a CPU
    src = torch.empty(n, dtype=torch.bfloat16, device=dev).fill_(1)
    dst = torch.empty_like(src)
    return 2 * src.numel() * src.element_size() / best(lambda: dst.copy_(src), reps)


def _decode(torch: Any, dev: str, best: Any, reps: int, quick: bool) -> tuple[dict[str, float], int]:
    """Weight bytes per second of `F.linear` of a [B, K] activation through a stack of bf16 weight
    matrices of a model-like size, far larger than the caches (one decode step's reads), per B."""
    F = torch.nn.functional  # loaded with torch (the caller imports it)

    gpu = dev == "cuda"
    k = 4096 if gpu else 1024
    shapes = [(k, k), (4 * k, k), (k, 4 * k)]
    total = 2**26 if quick else (2**32 if gpu else 2**29)  # 4 GiB / 512 MiB of weights per pass
    ws, size = [], 0
    while size < total:
        for nn, kk in shapes:
            ws.append(torch.empty(nn, kk, dtype=torch.bfloat16, device=dev).normal_(0, 0.02))
            size += nn * kk * 2
    bw = {}
    for batch in DECODE_BATCHES:
        xs = {kk: torch.randn(batch, kk, dtype=torch.bfloat16, device=dev) for kk in {s[1] for s in shapes}}

        def step(xs: dict[int, Any] = xs) -> None:
            for w in ws:
                F.linear(xs[w.shape[1]], w)
        bw[str(batch)] = size / best(step, max(2, reps // 4))
    return bw, size


def _gemm(torch: Any, dev: str, best: Any, reps: int, quick: bool) -> tuple[dict[str, dict[str, float]], dict[str, Any]]:
    """FLOP/s of bf16 (and on a GPU with `torch._scaled_mm`, fp8) [M, K] x [K, N] at prefill-like M."""
    F = torch.nn.functional  # loaded with torch (the caller imports it)

    gpu = dev == "cuda"
    kk = nn = 4096 if gpu else 1024
    w = torch.randn(nn, kk, dtype=torch.bfloat16, device=dev)
    out: dict[str, dict[str, float]] = {"bf16": {}}
    note: dict[str, Any] = {"gemm_shape": {"k": kk, "n": nn}}
    for m in (PREFILL_M if not quick else (256,)):
        x = torch.randn(m, kk, dtype=torch.bfloat16, device=dev)
        out["bf16"][str(m)] = 2 * m * kk * nn / best(lambda x=x: F.linear(x, w), reps)
    scaled_mm = getattr(torch, "_scaled_mm", None)
    if gpu and scaled_mm is not None and hasattr(torch, "float8_e4m3fn"):
        try:
            w8 = w.to(torch.float8_e4m3fn).t()  # column-major second operand, as _scaled_mm wants
            one = torch.ones((), device=dev)
            out["fp8"] = {}
            for m in PREFILL_M:
                x8 = torch.randn(m, kk, device=dev).to(torch.float8_e4m3fn)
                t = best(lambda x8=x8: scaled_mm(x8, w8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16), reps)
                out["fp8"][str(m)] = 2 * m * kk * nn / t
        except (RuntimeError, TypeError) as e:  # an older torch or a GPU without fp8
            out.pop("fp8", None)
            note["fp8_unavailable"] = f"{type(e).__name__}: {e}"
    return out, note


def _launch(torch: Any, dev: str, best: Any, reps: int, quick: bool) -> dict[str, float]:
    """The time of one tiny kernel launched eagerly and, on a GPU, replayed in a CUDA graph."""
    z = torch.zeros(16, device=dev)
    kernels = 20 if quick else 200

    def tiny() -> None:
        for _ in range(kernels):
            z.add_(1)
    out = {"launch_eager_s": best(tiny, reps) / kernels}
    if dev == "cuda":
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            tiny()
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(g):
            tiny()
        out["launch_graph_s"] = best(g.replay, reps) / kernels
    return out


def run(*, device: str | None = None, quick: bool = False) -> dict[str, Any]:
    """Every micro-benchmark on `device` ("cuda" or "cpu"; default: cuda when available).
    `quick`: smaller buffers and fewer repeats (tests)."""
    import torch

    dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
    best = _timer(torch, dev)
    reps = 3 if quick else (20 if dev == "cuda" else 5)
    out: dict[str, Any] = {"machine": machine(torch, dev), "device": dev}
    out["copy_bandwidth_Bps"] = _copy(torch, dev, best, reps, quick)
    out["decode_bandwidth_Bps"], out["decode_working_set_bytes"] = _decode(torch, dev, best, reps, quick)
    out["gemm_flops"], note = _gemm(torch, dev, best, reps, quick)
    out.update(note)
    out.update(_launch(torch, dev, best, reps, quick))
    out["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return out


__all__ = ["DECODE_BATCHES", "PREFILL_M", "machine", "run"]
