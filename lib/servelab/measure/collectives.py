"""The collectives of tensor and expert parallelism, timed between the GPUs of this machine with
torch.distributed over NCCL (one process per GPU): all-reduce and all-to-all of bf16 buffers from a
decode step's activations (a few KiB: batch x hidden x 2 bytes) to a long prefill's (tens of MiB), at
every GPU count 2, 4, 8 that the machine has. What `servelab calibrate-hw --collectives` stores in a
calibration entry (`micro.collectives`, fitted as alpha + bytes / beta by
`analysis.calibration.fit_collective`) for the performance model's TP and EP terms
(`analysis.perfmodel_parallel`).

NCCL's own algorithms are timed: an engine's custom all-reduce (vLLM's, SGLang's) may be faster for
small buffers, so the term is an upper bound of what the engine pays there. The NCCL_* environment
the measurement ran with is returned with it (NVLink multicast, NCCL_NVLS_ENABLE, stays as the
machine sets it). Not for the fit (`analysis.calibration`) nor the entry (`calibrate_hw`).
"""

from __future__ import annotations

import os
import socket
import statistics
import time
from typing import Any

SIZES = tuple(2**k for k in range(12, 27, 2))  # 4 KiB .. 64 MiB per GPU
OPS = ("all_reduce", "all_to_all")


def gpu_count() -> int:
    """CUDA GPUs torch sees here (0 without CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(rank: int, n: int, port: int, sizes: tuple[int, ...], iters: int, out: Any) -> None:
    """One GPU's process: every op at every size, `iters` timed repeats after a warm-up; rank 0 reports
    the median seconds per collective."""
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n)
    res: dict[str, list[dict[str, float]]] = {op: [] for op in OPS}
    for size in sizes:
        x = torch.ones(size // 2, dtype=torch.bfloat16, device="cuda")
        y = torch.empty_like(x)
        ops = {"all_reduce": lambda: dist.all_reduce(x), "all_to_all": lambda: dist.all_to_all_single(y, x)}
        for op, fn in ops.items():
            for _ in range(5):
                fn()
            times = []
            for _ in range(iters):
                dist.barrier()
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                fn()
                torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
            res[op].append({"bytes": float(size), "seconds": statistics.median(times)})
    if rank == 0:
        out.put(res)
    dist.destroy_process_group()


def measure(n: int, sizes: tuple[int, ...] = SIZES, iters: int = 20) -> dict[str, list[dict[str, float]]]:
    """{op: [{bytes, seconds}]} across the first n GPUs."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    mp.start_processes(_worker, args=(n, _free_port(), sizes, iters, q), nprocs=n, join=True, start_method="spawn")
    return q.get()


def run(sizes: tuple[int, ...] = SIZES) -> dict[str, Any]:
    """Every GPU count 2, 4, 8 this machine has: {"<n>": {op: [points]}}, with the NCCL_* environment.
    ValueError with one sentence when there are fewer than 2 GPUs."""
    have = gpu_count()
    if have < 2:
        raise ValueError(f"the collectives are measured between GPUs: this machine has {have} "
                         f"(need 2 or more)")
    import torch

    counts = [n for n in (2, 4, 8) if n <= have]
    return {"gpu": torch.cuda.get_device_properties(0).name, "points": {str(n): measure(n, sizes) for n in counts},
            "nccl_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("NCCL_")},
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


__all__ = ["OPS", "SIZES", "gpu_count", "measure", "run"]
