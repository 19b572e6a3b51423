"""Several client processes on this machine (`WorkerPool`), each with its own event loop, whose
results stream back to the parent that alone writes the records; a round is split across
them and merged back. Made by `pools.make_pool` from `workload.workers` (Ray actors on a
cluster: `ray_pool.RayWorkerPool`). Not for the grid, files or resume (`runner`)."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import signal
from dataclasses import asdict
from typing import Any, Callable

from ..hosts.base import Server
from . import client
from .rounds import Job, merge_stats, run_loop, run_round


def _worker_main(base_url: str, headers: dict[str, str], max_c: int, cmd_q: Any, out_q: Any) -> None:
    """A client process: runs the rounds it is sent, streams results back to the parent."""
    async def main() -> None:
        async with client.StreamClient(base_url, concurrency=max_c, headers=headers) as http:
            while True:
                cmd = await asyncio.get_running_loop().run_in_executor(None, cmd_q.get)
                if cmd is None:
                    return
                jobs = [Job(seq, client.RequestSpec(**spec), at) for seq, spec, at in cmd["jobs"]]
                stop = asyncio.Event()

                def emit(job: Job, res: client.RequestOutcome, lag: float | None) -> None:
                    out_q.put(("result", job.seq, res.model_dump(), lag))

                stats = await run_round(http, jobs, cmd["concurrency"], cmd["timeout_s"], emit, stop)
                out_q.put(("done", None, stats, None))

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides what an interrupt means
    run_loop(main())


class WorkerPool:
    """Persistent client processes; a round is split across them and merged back."""

    def __init__(self, n: int, server: Server, max_c: int) -> None:
        ctx = mp.get_context("spawn")
        self.out_q = ctx.Queue()
        self.cmd_qs = [ctx.Queue() for _ in range(n)]
        self.procs = [ctx.Process(target=_worker_main, args=(server.base_url, server.headers, max_c, q, self.out_q),
                                  daemon=True) for q in self.cmd_qs]
        for p in self.procs:
            p.start()

    async def run_round(self, jobs: list[Job], concurrency: int, timeout_s: float,
                        on_result: Callable[[Job, dict[str, Any], float | None], None]) -> dict[str, Any]:
        n = min(len(self.procs), max(1, concurrency))  # never a share without concurrency to send it
        by_seq = {j.seq: j for j in jobs}
        shares = [jobs[i::n] for i in range(n)]
        conc = [concurrency // n + (1 if i < concurrency % n else 0) for i in range(n)]
        active = [i for i in range(n) if shares[i] and conc[i] > 0]
        for i in active:
            self.cmd_qs[i].put({"jobs": [(j.seq, asdict(j.spec), j.at_s) for j in shares[i]],
                                "concurrency": conc[i], "timeout_s": timeout_s})
        loop = asyncio.get_running_loop()
        done, stats = 0, []
        while done < len(active):
            kind, seq, payload, lag = await loop.run_in_executor(None, self.out_q.get)
            if kind == "done":
                done += 1
                stats.append(payload)
            else:
                on_result(by_seq[seq], payload, lag)
        return merge_stats(stats)

    def describe(self) -> list[dict[str, Any]]:
        """The workers as run.json records them: local processes share the driver's clock."""
        return [{"backend": "local", "pid": p.pid, "offset_s": 0.0, "rtt_s": 0.0} for p in self.procs]

    def close(self) -> None:
        for q in self.cmd_qs:
            q.put(None)
        for p in self.procs:
            p.join(5)
            if p.is_alive():
                p.terminate()
