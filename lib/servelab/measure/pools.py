"""The pool `workload.workers` asks for: none (send in this process), local worker processes
(`workers.WorkerPool`) or Ray actors (`ray_pool.RayWorkerPool`). Above both pools, so that
neither imports the factory back."""

from __future__ import annotations

from typing import Any

from ..extras import require
from ..hosts.base import Server
from .workers import WorkerPool


def worker_count(spec: Any) -> int:
    """How many client workers `workload.workers` asks for (an int, or a `WorkerBackend`)."""
    return int(spec) if isinstance(spec, int) else int(spec.count)


def make_pool(spec: Any, server: Server, max_c: int) -> Any:
    """The pool `workload.workers` asks for: None (send in this process) for one local worker,
    `WorkerPool` for several local processes, `ray_pool.RayWorkerPool` for backend ray (any
    count, also 1). Each has `run_round(jobs, concurrency, timeout_s, on_result)`,
    `describe()` and `close()`."""
    if isinstance(spec, int) or spec.backend == "local":
        n = worker_count(spec)
        return WorkerPool(n, server, max_c) if n > 1 else None
    require("ray")  # MissingExtra with the install line, before ray_pool imports it
    from .ray_pool import RayWorkerPool

    return RayWorkerPool(spec.count, server, max_c, address=spec.address)
