"""Run a workload grid against one server and write the raw run folder.

For each bucket (input x output tokens) and each load level — a fixed concurrency c (closed
loop) or a request rate with constant or Poisson arrivals (open loop) — warmup rounds (kept,
flagged, excluded from results) then measured rounds. Each request's record is appended to
`records.jsonl` as it ends; the client's own overhead (event-loop lag, CPU) per round goes to
`client_stats.jsonl`; `/metrics` is sampled into `server_metrics.jsonl`; a finished level is
noted in `levels.jsonl` so `--resume` continues from the first incomplete one; `run.json` is
written at the start (running) and at the end (complete, partial or failed). Load can come
from several worker processes, each with its own event loop, merged into one record stream.
Not for starting engines (`engine`) or for the notebook/report layer.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import random
import signal
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
from tqdm.auto import tqdm

from . import client as sc
from .config import Bucket, Workload
from .engine import Server
from .records import (RECORDS, RUN_JSON, SERVER_METRICS, SUMMARY_CSV, RecordWriter, load_records, read_jsonl,
                      write_json)
from .runinfo import now_iso
from .summary import summarize
from .workload import Calibrated, calibrate, token_counter

SERVER_GONE = {sc.CONNECT, sc.DISCONNECT, sc.TIMEOUT}
CLIENT_STATS = "client_stats.jsonl"
LEVELS = "levels.jsonl"
LAG_TICK_S = 0.005
# A level is flagged as client-limited when the client's event loop lagged this much (p99)
# or the client process used this share of one CPU core (see `client_limited`).
LAG_LIMIT_S = 0.005
CPU_LIMIT_FRAC = 0.9


class RunAborted(RuntimeError):
    """The run stopped before its grid was complete (server gone, interrupted)."""


@dataclass
class Level:
    bucket: Bucket
    concurrency: int  # closed loop: in-flight requests; open loop: the cap
    rate_rps: float = 0.0  # 0 = closed loop

    @property
    def label(self) -> str:
        load = f"rate={self.rate_rps:g}/s" if self.rate_rps else f"c={self.concurrency}"
        return f"{self.bucket.label} {load}"


@dataclass
class RunResult:
    run_dir: Path
    status: str
    records: int
    summary: Any
    message: str = ""
    calibration: dict[str, Any] = field(default_factory=dict)


def levels(wl: Workload) -> list[Level]:
    if wl.arrival == "concurrency":
        return [Level(b, c) for b in wl.buckets for c in wl.concurrency]
    return [Level(b, wl.max_in_flight, r) for b in wl.buckets for r in wl.rates_rps]


def requests_per_round(wl: Workload, lv: Level) -> int:
    if lv.rate_rps:
        return max(1, round(lv.rate_rps * wl.duration_s))
    return lv.concurrency * wl.requests_per_round


def arrival_offsets(wl: Workload, lv: Level, n: int, seed: int) -> list[float]:
    """Scheduled send times (s from round start) for open-loop arrivals; seeded for Poisson."""
    if wl.arrival == "constant":
        return [i / lv.rate_rps for i in range(n)]
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(lv.rate_rps)
    return out


def calibrate_buckets(server: Server, wl: Workload, warn: Callable[[str], None] = print) -> dict[str, Calibrated]:
    counter = token_counter(server.base_url, server.model, wl.api, server.headers, server.tokenizer_dir,
                            wl.chat_template_kwargs, warn=warn)
    return {b.label: calibrate(counter, b.input_tokens, wl.prompt_text) for b in wl.buckets}


async def _server_healthy(c: sc.StreamClient) -> bool:
    for path in ("/health", "/v1/models"):
        if await c.status(path) == 200:
            return True
    return False


# -- one round of requests (used in-process and by worker processes) ----------------------------

@dataclass
class Job:
    seq: int
    spec: sc.RequestSpec
    at_s: float | None = None  # open loop: scheduled offset from round start


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


async def run_round(http: sc.StreamClient, jobs: list[Job], concurrency: int, timeout_s: float,
                    on_result: Callable[[Job, sc.Result, float | None], None], stop: asyncio.Event,
                    budget: Callable[[], bool] | None = None) -> dict[str, Any]:
    """Send `jobs`: closed loop with `concurrency` workers, or at their scheduled times (at_s).

    `on_result(job, result, send_lag_s)` is called as each request ends. Sending stops when
    `stop` is set or `budget()` says the failure budget is spent. Returns the client stats.
    """
    with LoopMonitor() as mon:
        if jobs and jobs[0].at_s is not None:
            await _open_loop(http, jobs, concurrency, timeout_s, on_result, stop, budget)
        else:
            queue = list(reversed(jobs))

            async def worker() -> None:
                while queue and not stop.is_set() and not (budget and budget()):
                    job = queue.pop()
                    res = await sc.send(http, job.spec, timeout_s=timeout_s)
                    on_result(job, res, None)

            await asyncio.gather(*(worker() for _ in range(concurrency)))
    return mon.stats()


async def _open_loop(http: sc.StreamClient, jobs: list[Job], cap: int, timeout_s: float,
                     on_result: Callable[..., None], stop: asyncio.Event, budget: Callable[[], bool] | None) -> None:
    sem = asyncio.Semaphore(cap)
    t0 = time.perf_counter()
    tasks = []

    async def one(job: Job, lag: float) -> None:
        try:
            res = await sc.send(http, job.spec, timeout_s=timeout_s)
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


# -- worker processes -----------------------------------------------------------------------------

def _worker_main(base_url: str, headers: dict[str, str], max_c: int, cmd_q: Any, out_q: Any) -> None:
    """A client process: runs the rounds it is sent, streams results back to the parent."""
    async def main() -> None:
        async with sc.StreamClient(base_url, concurrency=max_c, headers=headers) as http:
            while True:
                cmd = await asyncio.get_running_loop().run_in_executor(None, cmd_q.get)
                if cmd is None:
                    return
                jobs = [Job(seq, sc.RequestSpec(**spec), at) for seq, spec, at in cmd["jobs"]]
                stop = asyncio.Event()

                def emit(job: Job, res: sc.Result, lag: float | None) -> None:
                    out_q.put(("result", job.seq, res.to_dict(), lag))

                stats = await run_round(http, jobs, cmd["concurrency"], cmd["timeout_s"], emit, stop)
                out_q.put(("done", None, stats, None))

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides what an interrupt means
    _run(main())


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
        n = len(self.procs)
        by_seq = {j.seq: j for j in jobs}
        shares = [jobs[i::n] for i in range(n)]
        conc = [concurrency // n + (1 if i < concurrency % n else 0) for i in range(n)]
        active = [i for i in range(n) if shares[i] and conc[i] > 0]
        for i in active:
            self.cmd_qs[i].put({"jobs": [(j.seq, _spec_dict(j.spec), j.at_s) for j in shares[i]],
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
        return {"wall_s": max(s["wall_s"] for s in stats), "cpu_s": sum(s["cpu_s"] for s in stats),
                "cpu_frac": max(s["cpu_frac"] for s in stats),
                "loop_lag_p50_s": max(s["loop_lag_p50_s"] for s in stats),
                "loop_lag_p99_s": max(s["loop_lag_p99_s"] for s in stats),
                "loop_lag_max_s": max(s["loop_lag_max_s"] for s in stats),
                "lag_samples": sum(s["lag_samples"] for s in stats)}

    def close(self) -> None:
        for q in self.cmd_qs:
            q.put(None)
        for p in self.procs:
            p.join(5)
            if p.is_alive():
                p.terminate()


def _spec_dict(spec: sc.RequestSpec) -> dict[str, Any]:
    from dataclasses import asdict

    return asdict(spec)


# -- the grid ---------------------------------------------------------------------------------------

@dataclass
class ResumeState:
    done_levels: set[int]
    next_seq: int


def prepare_resume(run_dir: Path) -> ResumeState:
    """Keep records of finished levels only; move the rest aside. Returns what to skip."""
    done = {int(x["level"]) for x in read_jsonl(run_dir / LEVELS)}
    recs = read_jsonl(run_dir / RECORDS)
    keep = [r for r in recs if r.get("level") in done]
    drop = [r for r in recs if r.get("level") not in done]
    if drop:
        with RecordWriter(run_dir / f"records.superseded-{int(time.time())}.jsonl") as w:
            for r in drop:
                w.write(r)
    tmp = run_dir / (RECORDS + ".tmp")
    with RecordWriter(tmp) as w:
        for r in keep:
            w.write(r)
    tmp.replace(run_dir / RECORDS)
    stats = [s for s in read_jsonl(run_dir / CLIENT_STATS) if s.get("level") in done]
    (run_dir / CLIENT_STATS).unlink(missing_ok=True)
    with RecordWriter(run_dir / CLIENT_STATS) as w:
        for s in stats:
            w.write(s)
    return ResumeState(done, max((r["seq"] for r in recs), default=-1) + 1)


async def run_levels(server: Server, wl: Workload, run_dir: Path, *, study: str, config_id: str,
                     prompts: dict[str, Calibrated], progress: bool = True,
                     metrics_interval_s: float | None = 0.5, resume: ResumeState | None = None) -> tuple[int, str, str]:
    """Send the grid; returns (records written, status, message). Raises RunAborted after
    writing every finished record when the server stops answering."""
    run_token = uuid.uuid4().hex[:12]
    grid = levels(wl)
    done_levels = resume.done_levels if resume else set()
    plan = [(li, lv, wl.warmup_rounds + wl.rounds, requests_per_round(wl, lv)) for li, lv in enumerate(grid)
            if li not in done_levels]
    total = sum(r * n for _, _, r, n in plan)
    seq = resume.next_seq if resume else 0
    stop = asyncio.Event()
    interrupted = {"n": 0}
    loop = asyncio.get_running_loop()
    in_flight: set[asyncio.Task[Any]] = set()

    def on_sigint() -> None:
        interrupted["n"] += 1
        stop.set()
        if wl.on_interrupt == "cancel" or interrupted["n"] > 1:
            for t in list(in_flight):
                t.cancel()

    try:
        loop.add_signal_handler(signal.SIGINT, on_sigint)
        have_handler = True
    except (RuntimeError, ValueError, NotImplementedError):  # not the main thread (Jupyter)
        have_handler = False
    sampler_cm: Any = None
    if metrics_interval_s:
        from .metrics import MetricsSampler

        sampler_cm = MetricsSampler(server.base_url, run_dir / SERVER_METRICS, interval_s=metrics_interval_s,
                                    headers=server.headers)
    max_c = max(lv.concurrency for lv in grid)
    pool = WorkerPool(wl.workers, server, max_c) if wl.workers > 1 else None
    bar = tqdm(total=total, desc=config_id, unit="req", disable=not progress, dynamic_ncols=True)
    status, message = "complete", ""
    async with sc.StreamClient(server.base_url, concurrency=min(max_c, 4096), headers=server.headers) as http:
        sampler = await sampler_cm.__aenter__() if sampler_cm else None
        try:
            with RecordWriter(run_dir / RECORDS) as w, RecordWriter(run_dir / CLIENT_STATS) as cw, \
                    RecordWriter(run_dir / LEVELS) as lw:
                for li, lv, n_rounds, n_req in plan:
                    cal = prompts[lv.bucket.label]
                    if sampler:
                        sampler.set_level(lv.label)
                    level_sent = level_failed = 0
                    verdict = "complete"
                    for rnd in range(n_rounds):
                        warm = rnd < wl.warmup_rounds
                        bar.set_description(f"{config_id} {lv.label} {'warmup' if warm else 'round'} {rnd + 1}/{n_rounds}")
                        jobs = []
                        offsets = arrival_offsets(wl, lv, n_req, (wl.seed or 0) + 1000 * li + rnd) if lv.rate_rps else None
                        for i in range(n_req):
                            salt = None
                            if wl.cache_salt:
                                salt = f"{run_token}-{lv.bucket.label}" if lv.bucket.shared_prefix else f"{run_token}-{seq}"
                            spec = sc.RequestSpec(
                                prompt=cal.prompt, max_tokens=lv.bucket.output_tokens, model=server.model, api=wl.api,
                                temperature=wl.temperature, seed=wl.seed, ignore_eos=wl.ignore_eos, cache_salt=salt,
                                chat_template_kwargs=wl.chat_template_kwargs,
                                continuous_usage_stats=wl.continuous_usage_stats)
                            jobs.append(Job(seq, spec, offsets[i] if offsets else None))
                            seq += 1
                        results: list[dict[str, Any]] = []

                        def on_result(job: Job, res: Any, lag: float | None) -> None:
                            nonlocal level_sent, level_failed
                            d = res if isinstance(res, dict) else res.to_dict()
                            rec = {
                                "study": study, "config": config_id, "level": li, "bucket": lv.bucket.label,
                                "target_input_tokens": lv.bucket.input_tokens,
                                "target_output_tokens": lv.bucket.output_tokens,
                                "shared_prefix": lv.bucket.shared_prefix, "concurrency": lv.concurrency,
                                "rate_rps": lv.rate_rps, "arrival": wl.arrival,
                                "round": rnd, "warmup": warm, "seq": job.seq, "cache_salt": job.spec.cache_salt,
                                "scheduled_s": job.at_s, "send_lag_s": lag, **d,
                            }
                            w.write(rec)
                            results.append(rec)
                            if not warm:
                                level_sent += 1
                                level_failed += 0 if rec["ok"] else 1
                            bar.update(1)

                        def budget_spent() -> bool:
                            return bool(wl.failure_budget and level_sent >= 4
                                        and level_failed / level_sent > wl.failure_budget)

                        if pool:
                            stats = await pool.run_round(jobs, lv.concurrency, wl.timeout_s, on_result)
                        else:
                            task = asyncio.ensure_future(run_round(http, jobs, lv.concurrency, wl.timeout_s, on_result,
                                                                   stop, budget_spent if not warm else None))
                            in_flight.add(task)
                            try:
                                stats = await task
                            except asyncio.CancelledError:
                                stats = {}
                            finally:
                                in_flight.discard(task)
                        cw.write({"level": li, "label": lv.label, "round": rnd, "warmup": warm, "requests": len(results),
                                  "workers": wl.workers, **stats})
                        if stop.is_set():
                            raise RunAborted(f"interrupted by the user (Ctrl-C) during level '{lv.label}' round {rnd + 1}; "
                                             f"in-flight requests {'cancelled' if wl.on_interrupt == 'cancel' else 'drained'}; "
                                             f"{w.count} records kept in {run_dir / RECORDS}")
                        if results and all(not r["ok"] and r["error_kind"] in SERVER_GONE for r in results):
                            if not await _server_healthy(http):
                                kinds = sorted({r["error_kind"] for r in results})
                                raise RunAborted(
                                    f"server at {server.base_url} stopped answering during level '{lv.label}' "
                                    f"round {rnd + 1}: all {len(results)} requests failed ({', '.join(kinds)}: "
                                    f"{results[-1]['error_detail']}); {w.count} records kept in {run_dir / RECORDS}")
                        if not warm and budget_spent():
                            verdict = (f"stopped early: {level_failed} of {level_sent} requests failed "
                                       f"(> failure budget {wl.failure_budget:.0%})")
                            message += f"level '{lv.label}': {verdict}. "
                            status = "partial"
                            break
                    lw.write({"level": li, "label": lv.label, "status": verdict, "sent": level_sent,
                              "failed": level_failed})
                return w.count, status, message.strip()
        except RunAborted as e:
            return w.count, "partial", str(e)
        finally:
            bar.close()
            if pool:
                pool.close()
            if have_handler:
                loop.remove_signal_handler(signal.SIGINT)
            if sampler_cm:
                await sampler_cm.__aexit__(None, None, None)


def run_workload(server: Server, wl: Workload, run_dir: Path, *, study: str, config_id: str,
                 record: dict[str, Any], progress: bool = True, metrics_interval_s: float | None = None,
                 log: Callable[[str], None] = print, resume: bool = False) -> RunResult:
    """Calibrate prompts, run the grid, write summary.csv and run.json. Never loses records:
    on abort or Ctrl-C the summary and run.json are written with status 'partial'.
    `metrics_interval_s` overrides the workload's /metrics sampling period (0 = off)."""
    if metrics_interval_s is None:
        metrics_interval_s = wl.metrics_interval_s
    run_dir = Path(run_dir)
    state = None
    if (run_dir / RECORDS).exists():
        if not resume:
            raise FileExistsError(f"{run_dir / RECORDS} exists: runs are immutable; remove the folder or use a new id")
        state = prepare_resume(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    prompts = calibrate_buckets(server, wl, warn=log)
    cal = {k: {"target_tokens": v.target_tokens, "tokens": v.tokens, "counter": v.counter, "probes": v.probes,
               "prompt_chars": len(v.prompt)} for k, v in prompts.items()}
    if state and (run_dir / RUN_JSON).exists():
        from .records import read_json

        prev = read_json(run_dir / RUN_JSON)
        record.setdefault("resumed", []).extend(prev.get("resumed", []))
        record["resumed"].append({"at": now_iso(), "skipped_levels": sorted(state.done_levels),
                                  "previous_status": prev.get("status")})
        record["started_at"] = prev.get("started_at", record.get("started_at"))
    record.update({"server": server.info, "model_name": server.model, "workload": wl.model_dump(),
                   "calibration": cal, "status": "running"})
    write_json(run_dir / RUN_JSON, record)
    status, message = "failed", ""
    t0 = now_iso()
    try:
        _, status, message = run_sync(run_levels(server, wl, run_dir, study=study, config_id=config_id,
                                                 prompts=prompts, progress=progress,
                                                 metrics_interval_s=metrics_interval_s, resume=state))
    except KeyboardInterrupt:
        status, message = "partial", "interrupted by the user (Ctrl-C)"
        raise
    finally:
        df = load_records(run_dir)
        summ = summarize(df)
        if not summ.empty:
            summ.to_csv(run_dir / SUMMARY_CSV, index=False)
        record.update({"status": status, "message": message, "measured_from": t0, "finished_at": now_iso(),
                       "records": len(df), "headline": _headline(summ),
                       "client_limited_levels": client_limited(run_dir)})
        write_json(run_dir / RUN_JSON, record)
    return RunResult(run_dir, status, len(df), summ, message, cal)


def client_limited(run_dir: Path) -> list[dict[str, Any]]:
    """Measured rounds where the client itself may have limited the result."""
    out = []
    for s in read_jsonl(Path(run_dir) / CLIENT_STATS):
        if s.get("warmup") or "loop_lag_p99_s" not in s:
            continue
        reasons = []
        if s["loop_lag_p99_s"] > LAG_LIMIT_S:
            reasons.append(f"event-loop lag p99 {s['loop_lag_p99_s'] * 1000:.1f} ms > {LAG_LIMIT_S * 1000:.0f} ms")
        if s["cpu_frac"] > CPU_LIMIT_FRAC * max(1, s.get("workers", 1)):
            reasons.append(f"client CPU {s['cpu_frac'] * 100:.0f}% of a core")
        if reasons:
            out.append({"level": s["level"], "label": s["label"], "round": s["round"], "reasons": reasons})
    return out


def _run(coro: Any) -> Any:
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
        return _run(coro)
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        return ex.submit(_run, coro).result()


def _headline(summ: Any) -> dict[str, Any]:
    if summ is None or getattr(summ, "empty", True):
        return {}
    sent = int(summ["sent"].sum())
    return {
        "sent": sent, "ok": int(summ["ok"].sum()),
        "success_rate": float(summ["ok"].sum() / sent) if sent else None,
        "max_aggregate_output_tps": float(summ["aggregate_output_tps"].max()),
        "decode_tps_p50_at_c1": _at_c1(summ, "decode_tps_p50"),
        "ttft_p50_s_at_c1": _at_c1(summ, "ttft_p50_s"),
    }


def _at_c1(summ: Any, col: str) -> dict[str, float]:
    c1 = summ[summ["concurrency"] == summ["concurrency"].min()]
    return {str(b): float(v) for b, v in zip(c1["bucket"], c1[col])}
