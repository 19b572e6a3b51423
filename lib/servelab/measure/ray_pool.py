"""Client workers as Ray actors, for load that one machine cannot send (`workload.workers:
{backend: ray, count: N, address: ...}`).

`RayWorkerPool` has `WorkerPool`'s interface (`run_round`, `describe`, `close`). Each worker is
an actor (`ClientActor`, threaded) whose own thread runs servelab's streaming client
(`rounds.run_round` -> `client.send`) on its own event loop (uvloop when installed) for its
share of every round (`jobs[i::n]`, the concurrency split the same way). Results stream back
while the round runs: the driver keeps one `poll()` call in flight per actor, which returns
whatever finished since the last one (a batch, at most `POLL_WAIT_S` after the first result),
so the Ray cost is one call per batch, not per request. The driver alone writes records.

Time: every request is timed on the worker that sends it (`perf_counter`). Before the first
round the driver measures each worker's clock offset NTP-style: `CLOCK_SAMPLES` round trips,
the sample with the least round trip kept, offset_s = worker_t - (t0 + t1) / 2, error bound
rtt_s / 2. Each round starts at one driver time, which each worker reads on its own clock (a
start barrier without a coordinator), and the start_s/end_s of every result are shifted into
the driver's clock, so max end - min start across workers (`summary.round_throughput`) holds
across hosts. The offsets are measured again at `close()` (drift) and `describe()` gives them
to run.json (`workers`).

Faults: a worker whose actor dies (or stops answering for timeout_s + `SILENT_GRACE_S`) has
every job it had not reported recorded once through `on_result` as a failed result with
error_kind "worker_lost" and Ray's reason; the driver tracks the seqs it has received, so a
late or repeated result is dropped, never written twice. The round goes on with the other
workers, later rounds are split across the survivors, and when none is left `run_round`
raises `rounds.PoolLost` (the run ends as partial; `--resume` redoes the level).
Not for the grid, files or resume (`runner`).
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any, Callable

import ray
from ray.exceptions import RayError

from ..log import progress_line
from ..hosts.base import Server
from . import client
from .rounds import Job, PoolLost, merge_stats, run_loop, run_round

WORKER_LOST = "worker_lost"
CLOCK_SAMPLES = 8  # round trips per clock-offset measurement (the least RTT is kept)
POLL_WAIT_S = 0.02  # a poll returns this long after its first result (or empty, when idle)
POLL_BATCH_MAX = 2048  # results per poll at most
START_LEAD_S = 0.05  # a round starts this long (+ 2 x the worst RTT) after the driver sends it
SILENT_GRACE_S = 30.0  # a worker silent for the request timeout + this long is declared lost
REASON_CHARS = 600


class ClientActor:
    """One Ray client worker: servelab's client in a thread of its own (own event loop);
    Ray calls `start_round`, `poll`, `clock_s` and `info` from other threads.

    Ray starts its workers at niceness 15 (`worker_niceness`), below the engine and everything
    else on the node, which is timing error for a load generator: the actor sets every thread
    of its process to `niceness` (the driver's) when allowed, and `info()` says what it got.
    `skew_s` is added to every time this worker reports (`clock_s`, results) and subtracted
    from the start times it is given: it emulates a host whose clock has another origin."""

    def __init__(self, base_url: str, headers: dict[str, str], max_c: int, skew_s: float = 0.0,
                 niceness: int | None = None) -> None:
        self.skew_s = skew_s
        if niceness is not None:
            _renice(niceness)
        # Commands reach the loop through call_soon_threadsafe, never a thread blocked on a queue:
        # Ray ends an actor whose handles went out of scope gracefully (interpreter exit), and
        # exit joins every executor thread, so one parked in `queue.get()` for a command that
        # never comes kept the process alive forever, re-parented to init (`ray::ClientActor`).
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._cmds: asyncio.Queue[Any] | None = None
        self._out: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=run_loop, args=(self._main(base_url, headers, max_c),), daemon=True)
        self._thread.start()
        self._ready.wait(30.0)

    async def _main(self, base_url: str, headers: dict[str, str], max_c: int) -> None:
        self._loop, self._cmds = asyncio.get_running_loop(), asyncio.Queue()
        self._ready.set()
        skew = self.skew_s

        def emit(job: Job, res: client.RequestOutcome, lag: float | None) -> None:
            d = res.model_dump()
            if skew:
                d["start_s"] += skew
                d["end_s"] += skew
            self._out.put(("result", job.seq, d, lag))

        async with client.StreamClient(base_url, concurrency=max_c, headers=headers) as http:
            while True:
                cmd = await self._cmds.get()
                if cmd is None:
                    return
                raw, concurrency, timeout_s, start_at_s = cmd
                jobs = [Job(seq, client.RequestSpec(**spec), at) for seq, spec, at in raw]
                wait_s = start_at_s - time.perf_counter()
                if wait_s > 0:
                    await asyncio.sleep(wait_s)
                late_s = time.perf_counter() - start_at_s  # how far past the barrier this share began
                stats = await run_round(http, jobs, concurrency, timeout_s, emit, asyncio.Event())
                self._out.put(("done", None, {**stats, "start_late_s": late_s}, None))

    def clock_s(self) -> float:
        return time.perf_counter() + self.skew_s

    def info(self) -> dict[str, Any]:
        ctx = ray.get_runtime_context()
        return {"node_id": ctx.get_node_id(), "node_ip": ray.util.get_node_ip_address(), "pid": os.getpid(),
                "actor_id": ctx.get_actor_id(), "niceness": os.getpriority(os.PRIO_PROCESS, 0)}

    def start_round(self, jobs: list[tuple[int, dict[str, Any], float | None]], concurrency: int,
                    timeout_s: float, start_at_s: float) -> None:
        """Queue a round that starts at `start_at_s` on this worker's clock."""
        assert self._loop is not None and self._cmds is not None
        self._loop.call_soon_threadsafe(self._cmds.put_nowait, (jobs, concurrency, timeout_s, start_at_s - self.skew_s))

    def poll(self, wait_s: float) -> list[tuple[str, int | None, dict[str, Any], float | None]]:
        """What finished since the last poll: waits up to `wait_s` for a first item, then
        `POLL_WAIT_S` more for others to join the batch."""
        try:
            items = [self._out.get(timeout=wait_s)]
        except queue.Empty:
            return []
        deadline = time.perf_counter() + POLL_WAIT_S
        while len(items) < POLL_BATCH_MAX and items[-1][0] != "done":
            left = deadline - time.perf_counter()
            try:
                items.append(self._out.get(timeout=left) if left > 0 else self._out.get_nowait())
            except queue.Empty:
                break
        return items


def _renice(niceness: int) -> None:
    """Set every thread of this process to `niceness` (on Linux nice is per thread); lowering
    it needs CAP_SYS_NICE, so a refusal is left as it is (`info()` reports the value)."""
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    for tid in tids:
        try:
            os.setpriority(os.PRIO_PROCESS, tid, niceness)
        except OSError:
            pass


@dataclass
class _Worker:
    index: int
    name: str
    actor: Any
    info: dict[str, Any]
    offset_s: float = 0.0
    rtt_s: float = 0.0
    offset_end_s: float | None = None
    rtt_end_s: float | None = None
    lost: str | None = None


def measure_offset(actor: Any, samples: int = CLOCK_SAMPLES) -> tuple[float, float]:
    """(offset_s, rtt_s) of an actor's clock to this process's perf_counter: the least-RTT of
    `samples` round trips; the true offset is within offset_s +- rtt_s / 2."""
    best: tuple[float, float] | None = None
    ray.get(actor.clock_s.remote())  # first call pays connection set-up
    for _ in range(samples):
        t0 = time.perf_counter()
        w = ray.get(actor.clock_s.remote())
        t1 = time.perf_counter()
        if best is None or t1 - t0 < best[1]:
            best = (w - (t0 + t1) / 2, t1 - t0)
    assert best is not None
    return best


def _round_stats(stats: list[dict[str, Any]], result_lag_s: list[float]) -> dict[str, Any]:
    """The workers' round stats merged, with the latest start and the results' lag to the driver."""
    out = merge_stats(stats)
    if stats:
        out["start_late_max_s"] = max(s["start_late_s"] for s in stats)
    if result_lag_s:
        result_lag_s.sort()
        out["result_lag_p50_s"] = result_lag_s[len(result_lag_s) // 2]
        out["result_lag_max_s"] = result_lag_s[-1]
    return out


class RayWorkerPool:
    """`count` client actors spread over the Ray cluster; a round is split across them and
    merged back (see the module docstring)."""

    def __init__(self, count: int, server: Server, max_c: int, *, address: str | None = None,
                 num_cpus: float = 1.0, clock_skew_s: list[float] | None = None, start_timeout_s: float = 120.0,
                 log: Callable[[str], None] | None = None) -> None:
        self.log = log or progress_line
        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:
            ray.init(address=address, ignore_reinit_error=True, logging_level="warning")
        cpus = ray.cluster_resources().get("CPU", 0.0)
        if cpus < count * num_cpus:
            self.log(f"{count} Ray client workers need {count * num_cpus:g} CPUs, the cluster has {cpus:g}: "
                     f"waiting up to {start_timeout_s:g} s for nodes to join")
        actor_cls = ray.remote(num_cpus=num_cpus, max_concurrency=4, max_restarts=0)(ClientActor)
        token = uuid.uuid4().hex[:8]
        skews = clock_skew_s or [0.0] * count
        nice = os.getpriority(os.PRIO_PROCESS, 0)
        handles = []
        for i in range(count):
            name = f"servelab-client-{token}-{i}"
            handles.append((name, actor_cls.options(name=name, scheduling_strategy="SPREAD").remote(
                server.base_url, server.headers, max_c, skews[i], nice)))
        self.workers: list[_Worker] = []
        try:
            infos = ray.get([h.info.remote() for _, h in handles], timeout=start_timeout_s)
            self.workers = [_Worker(i, name, h, info) for i, ((name, h), info) in enumerate(zip(handles, infos))]
            for w in self.workers:
                w.offset_s, w.rtt_s = measure_offset(w.actor)
        except BaseException as e:  # no actor (nor the Ray this pool started) outlives a failed start
            have = f"cluster resources: {ray.cluster_resources()}" if isinstance(e, RayError) else ""
            self._end([h for _, h in handles])
            if isinstance(e, RayError):
                raise PoolLost(f"{count} Ray client workers did not start within {start_timeout_s:g} s "
                               f"({have}): {e}") from e
            raise
        for w in self.workers:
            if w.info["niceness"] > nice:
                self.log(f"Ray client worker {w.index} ({w.info['node_ip']}) runs at niceness {w.info['niceness']} "
                         f"(this driver: {nice}) and could not lower it: start the cluster with "
                         f"RAY_worker_niceness={nice} (ray start) so the client is not the node's last priority")
        self.duplicates = 0  # results that came for a seq already recorded (dropped)

    def describe(self) -> list[dict[str, Any]]:
        """Per worker, as run.json records it: where it ran, its clock offset to the driver
        (offset_s, within +- rtt_s / 2), the offset again at close (drift) and why it was lost."""
        return [{"worker": w.index, "backend": "ray", "actor_name": w.name, **w.info, "offset_s": w.offset_s,
                 "rtt_s": w.rtt_s, "offset_end_s": w.offset_end_s, "rtt_end_s": w.rtt_end_s,
                 "clock_samples": CLOCK_SAMPLES, "lost": w.lost} for w in self.workers]

    async def run_round(self, jobs: list[Job], concurrency: int, timeout_s: float,
                        on_result: Callable[[Job, dict[str, Any], float | None], None]) -> dict[str, Any]:
        active, start_at_s = self._start_round(jobs, concurrency, timeout_s)
        by_seq = {j.seq: j for j in jobs}
        pending = {w.index: {j.seq for j in s} for w, s, _ in active}
        wait_s = START_LEAD_S + 1.0
        polls = {asyncio.wrap_future(w.actor.poll.remote(wait_s).future()): w for w, _, _ in active}
        heard = {w.index: time.perf_counter() for w, _, _ in active}
        stats: list[dict[str, Any]] = []
        result_lag_s: list[float] = []
        while polls:
            done, _ = await asyncio.wait(polls, timeout=wait_s + 1.0, return_when=asyncio.FIRST_COMPLETED)
            for fut in done:
                w = polls.pop(fut)
                try:
                    items = fut.result()
                except RayError as e:
                    self._lose(w, f"{type(e).__name__}: {e}", pending[w.index], by_seq, on_result, start_at_s)
                    continue
                now = heard[w.index] = time.perf_counter()
                finished = self._take(w, items, pending[w.index], by_seq, on_result, stats, result_lag_s, now)
                if not finished:
                    polls[asyncio.wrap_future(w.actor.poll.remote(wait_s).future())] = w
                elif pending[w.index]:  # cannot happen without a stop; never leave a job unrecorded
                    self._lose(w, "finished its round without reporting these jobs", pending[w.index], by_seq,
                               on_result, start_at_s)
            now = time.perf_counter()
            for fut, w in list(polls.items()):
                if now - heard[w.index] > timeout_s + SILENT_GRACE_S:
                    polls.pop(fut).cancel()
                    self._lose(w, f"no answer for {now - heard[w.index]:.0f} s", pending[w.index], by_seq,
                               on_result, start_at_s)
        out = _round_stats(stats, result_lag_s)
        out["workers_lost"] = sum(w.lost is not None for w in self.workers)
        if all(w.lost is not None for w in self.workers):
            # Lost in this round (not only before the next): the level must not be summed up as
            # finished with a round of worker_lost records; it ends the run and --resume redoes it.
            raise PoolLost(self._lost_message())
        return out

    def _start_round(self, jobs: list[Job], concurrency: int,
                     timeout_s: float) -> tuple[list[tuple[_Worker, list[Job], int]], float]:
        """The round's jobs and concurrency shared over the live workers, each told to start at one
        instant (driver clock); returns (worker, share, concurrency) of those with a share, and that instant."""
        live = [w for w in self.workers if w.lost is None]
        if not live:
            raise PoolLost(self._lost_message())
        n = min(len(live), max(1, concurrency))  # never a share without concurrency to send it
        live = live[:n]
        shares = [jobs[i::n] for i in range(n)]
        conc = [concurrency // n + (1 if i < concurrency % n else 0) for i in range(n)]
        active = [(w, s, c) for w, s, c in zip(live, shares, conc) if s and c > 0]
        start_at_s = time.perf_counter() + START_LEAD_S + 2 * max(w.rtt_s for w in live)  # driver clock
        for w, share, c in active:
            w.actor.start_round.remote([(j.seq, asdict(j.spec), j.at_s) for j in share], c, timeout_s,
                                       start_at_s + w.offset_s)
        return active, start_at_s

    def _take(self, w: _Worker, items: list[Any], pending: set[int], by_seq: dict[int, Job],
              on_result: Callable[[Job, dict[str, Any], float | None], None], stats: list[dict[str, Any]],
              result_lag_s: list[float], now: float) -> bool:
        """One poll's items of worker `w`: results shifted to the driver's clock and recorded (a
        duplicate dropped), its round stats kept; True once the worker reported its round done."""
        finished = False
        for kind, seq, payload, lag in items:
            if kind == "done":
                stats.append(payload)
                finished = True
            elif seq in pending:
                pending.discard(seq)
                payload["start_s"] -= w.offset_s
                payload["end_s"] -= w.offset_s
                result_lag_s.append(now - payload["end_s"])
                on_result(by_seq[seq], payload, lag)
            else:
                self.duplicates += 1
        return finished

    def _lost_message(self) -> str:
        return "every Ray client worker is lost: " + "; ".join(f"worker {w.index}: {w.lost}" for w in self.workers)

    def _lose(self, w: _Worker, reason: str, pending: set[int], by_seq: dict[int, Job],
              on_result: Callable[[Job, dict[str, Any], float | None], None], start_at_s: float) -> None:
        """Record every job `w` had not reported as worker_lost (once), and stop using it."""
        w.lost = reason[:REASON_CHARS]
        left = sum(x.lost is None for x in self.workers)
        self.log(f"Ray client worker {w.index} ({w.info.get('node_ip')}) lost mid-round: {w.lost}; its "
                 f"{len(pending)} unfinished requests are recorded as {WORKER_LOST}; {left} workers left")
        detail = f"Ray client worker {w.index} on {w.info.get('node_ip')} lost: {w.lost}"
        end_s = time.perf_counter()
        for seq in sorted(pending):
            r = client.RequestOutcome(ok=False, error_kind=WORKER_LOST, error_detail=detail[:REASON_CHARS], start_s=start_at_s,
                                    end_s=end_s)
            on_result(by_seq[seq], r.model_dump(), None)
        pending.clear()
        try:
            ray.kill(w.actor, no_restart=True)
        except RayError:
            pass

    def close(self) -> None:
        """Measure the offsets again (drift over the run), then end the actors (and the local
        Ray this pool started, if it did)."""
        for w in self.workers:
            if w.lost is None:
                try:
                    w.offset_end_s, w.rtt_end_s = measure_offset(w.actor)
                except RayError:
                    pass
        self._end([w.actor for w in self.workers])

    def _end(self, actors: list[Any]) -> None:
        """Kill `actors` (a forced kill: nothing of theirs runs on) and shut down the Ray this
        pool started, if it did."""
        for a in actors:
            try:
                ray.kill(a, no_restart=True)
            except (RayError, ValueError):
                pass
        if self._owns_ray:
            ray.shutdown()
