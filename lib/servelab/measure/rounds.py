"""One round of requests, the pieces every way of sending shares: a `Job`, `run_round` (closed
loop at a fixed concurrency, or open loop at scheduled times) on one event loop, the client's
own overhead meter (`LoopMonitor`) and how rounds' stats merge, `PoolLost`, and the event-loop
runner (`run_loop`: uvloop when installed; `run_sync` also from inside a running loop). Used by
this process (`runner`), the local worker processes (`workers`) and the Ray actors
(`ray_pool`); it imports neither. Not for the grid, files or resume (`runner`)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np

from ..errors import ServelabError
from . import client

LAG_TICK_S = 0.005


@dataclass
class Job:
    seq: int
    spec: client.RequestSpec
    at_s: float | None = None  # open loop: scheduled offset from round start
    meta: dict[str, Any] = field(default_factory=dict)  # the source's record fields (stay in the driver)


class LoopMonitor:
    """Measures the event loop's lag (how late a 5 ms sleep wakes up) and process CPU time."""

    def __init__(self) -> None:
        self.lags: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            t = time.perf_counter()
            await asyncio.sleep(LAG_TICK_S)
            self.lags.append(max(0.0, time.perf_counter() - t - LAG_TICK_S))

    def __enter__(self) -> "LoopMonitor":
        self.t0, self.cpu0 = time.perf_counter(), time.process_time()
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._task:
            self._task.cancel()
        self.wall_s = time.perf_counter() - self.t0
        self.cpu_s = time.process_time() - self.cpu0

    def stats(self) -> dict[str, Any]:
        lag = np.array(self.lags) if self.lags else np.array([0.0])
        return {"wall_s": self.wall_s, "cpu_s": self.cpu_s,
                "cpu_frac": self.cpu_s / self.wall_s if self.wall_s > 0 else 0.0,
                "loop_lag_p50_s": float(np.percentile(lag, 50)), "loop_lag_p99_s": float(np.percentile(lag, 99)),
                "loop_lag_max_s": float(lag.max()), "lag_samples": len(self.lags)}


async def run_round(http: client.StreamClient, jobs: Any, concurrency: int, timeout_s: float,
                    on_result: Callable[[Job, client.RequestOutcome, float | None], None], stop: asyncio.Event,
                    budget: Callable[[], bool] | None = None, duration_s: float | None = None,
                    ramp_s: float = 0.0) -> dict[str, Any]:
    """Send `jobs`: closed loop with `concurrency` workers, or at their scheduled times (at_s).

    `on_result(job, result, send_lag_s)` is called as each request ends. Sending stops when
    `stop` is set or `budget()` says the failure budget is spent; with `duration_s` (closed
    loop; `jobs` may then be an endless iterator) no request starts after that many seconds.
    `ramp_s` (closed loop): worker k starts k / concurrency of it late, and its first request,
    sent before the loop is full, carries `warmup` and `ramp` in its record fields.
    Returns the client stats.
    """
    with LoopMonitor() as mon:
        if isinstance(jobs, list) and jobs and jobs[0].at_s is not None:
            await _open_loop(http, jobs, concurrency, timeout_s, on_result, stop, budget)
        else:
            it = iter(jobs)
            end = time.perf_counter() + duration_s if duration_s else None

            async def worker(k: int) -> None:
                first = ramp_s > 0
                if first and k:
                    await asyncio.sleep(k * ramp_s / concurrency)
                while not stop.is_set() and not (budget and budget()) and (end is None or time.perf_counter() < end):
                    job = next(it, None)
                    if job is None:
                        return
                    if first:  # sent while the loop fills: not the level's load
                        job, first = replace(job, meta={**job.meta, "warmup": True, "ramp": True}), False
                    res = await client.send(http, job.spec, timeout_s=timeout_s)
                    on_result(job, res, None)

            await asyncio.gather(*(worker(k) for k in range(concurrency)))
    return mon.stats()


async def _open_loop(http: client.StreamClient, jobs: list[Job], cap: int, timeout_s: float,
                     on_result: Callable[..., None], stop: asyncio.Event, budget: Callable[[], bool] | None) -> None:
    sem = asyncio.Semaphore(cap)
    t0 = time.perf_counter()
    tasks = []

    async def one(job: Job, lag: float) -> None:
        try:
            res = await client.send(http, job.spec, timeout_s=timeout_s)
            on_result(job, res, lag)
        finally:
            sem.release()

    for job in jobs:
        wait = t0 + (job.at_s or 0.0) - time.perf_counter()
        if wait > 0:
            await asyncio.sleep(wait)
        if stop.is_set() or (budget and budget()):
            break
        await sem.acquire()
        lag = time.perf_counter() - t0 - (job.at_s or 0.0)
        tasks.append(asyncio.create_task(one(job, lag)))
    await asyncio.gather(*tasks)


class PoolLost(ServelabError, RuntimeError):
    """Every worker of a pool is gone: the run cannot go on (it ends as partial)."""


def merge_stats(stats: list[dict[str, Any]]) -> dict[str, Any]:
    """One round's client stats from its workers' (`LoopMonitor.stats`): the slowest worker's
    wall time and lag, the sum of CPU time."""
    if not stats:
        return {}
    return {"wall_s": max(s["wall_s"] for s in stats), "cpu_s": sum(s["cpu_s"] for s in stats),
            "cpu_frac": max(s["cpu_frac"] for s in stats),
            "loop_lag_p50_s": max(s["loop_lag_p50_s"] for s in stats),
            "loop_lag_p99_s": max(s["loop_lag_p99_s"] for s in stats),
            "loop_lag_max_s": max(s["loop_lag_max_s"] for s in stats),
            "lag_samples": sum(s["lag_samples"] for s in stats)}


def run_loop(coro: Any) -> Any:
    """asyncio.run on uvloop when it is installed (it ships with vLLM's server deps): the
    self-check measured it halving servelab's own TTFT error at 256 streams
    (benchmarks/README.md)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as r:
        return r.run(coro)


def run_sync(coro: Any) -> Any:
    """Run a coroutine to completion, also from inside a running loop (Jupyter): then in a
    worker thread with its own loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return run_loop(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        return ex.submit(run_loop, coro).result()
