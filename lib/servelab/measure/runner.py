"""Run a workload grid against one server and write the raw run folder.

For each bucket (input x output tokens) and each load level — a fixed concurrency c (closed
loop) or a request rate with constant or Poisson arrivals (open loop) — warmup rounds (kept,
flagged, excluded from results) then measured rounds. Each request's record is appended to
`records.jsonl` as it ends; the client's own overhead per round goes to `client_stats.jsonl`;
`/metrics` (and, on a GPU machine, NVML) is sampled beside the run; a finished level is noted in
`levels.jsonl` so `--resume` continues from the first incomplete one; `run.json` is written at
the start (running) and once at the end (complete, partial or failed). Ctrl-C, SIGTERM and
SIGHUP end a run the same way: in-flight requests cancelled (or drained), every finished
record kept, run.json partial with the reason. One line per level goes to the terminal.
Not for starting engines (`hosts`) or the notebook/report layer.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from tqdm.auto import tqdm

from ..hosts.base import Server
from ..runfolder import CLIENT_STATS, GPU_METRICS, LEVELS, RECORDS, SERVER_METRICS, JsonlWriter, RunFolder, now_iso, read_jsonl
from ..schema import Workload
from . import client as sc
from ..errors import ServelabError
from .grid import Level, cache_counters, arrival_offsets, levels, make_sources, requests_per_round
from .pools import make_pool, worker_count
from .rounds import Job, LoopMonitor, PoolLost, run_round, run_sync
from .sources import Draft, RoundCtx
from .workers import WorkerPool
from .workload import TokenCounter, token_counter

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

SERVER_GONE = {sc.CONNECT, sc.DISCONNECT, sc.TIMEOUT}

# A level is flagged as client-limited when the client's event loop lagged this much (p99)
# or the client process used this share of one CPU core (see `client_limited`).
LAG_LIMIT_S = 0.005

CPU_LIMIT_FRAC = 0.9


class RunAborted(ServelabError, RuntimeError):
    """The run stopped before its grid was complete (server gone, interrupted)."""


@dataclass
class RunResult:
    run_dir: Path
    status: str
    records: int
    summary: Any
    message: str = ""
    calibration: dict[str, Any] = field(default_factory=dict)


def server_counter(server: Server, wl: Workload, warn: Callable[[str], None] = print) -> TokenCounter:
    """The token counter of this server and workload (its /tokenize, else the local tokenizer)."""
    return token_counter(server.base_url, server.model, wl.api, server.headers, server.tokenizer_dir,
                         wl.chat_template_kwargs, warn=warn)


async def _server_healthy(c: sc.StreamClient) -> bool:
    for path in ("/health", "/v1/models"):
        if await c.status(path) == 200:
            return True
    return False


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
        with JsonlWriter(run_dir / f"records.superseded-{int(time.time())}.jsonl") as w:
            for r in drop:
                w.write(r)
    tmp = run_dir / (RECORDS + ".tmp")
    with JsonlWriter(tmp) as w:
        for r in keep:
            w.write(r)
    tmp.replace(run_dir / RECORDS)
    stats = [s for s in read_jsonl(run_dir / CLIENT_STATS) if s.get("level") in done]
    (run_dir / CLIENT_STATS).unlink(missing_ok=True)
    with JsonlWriter(run_dir / CLIENT_STATS) as w:
        for s in stats:
            w.write(s)
    return ResumeState(done, max((r["seq"] for r in recs), default=-1) + 1)


class LevelRunner:
    """Sends the grid of one configuration, level by level, writing every record as it ends.

    `run()` returns (records written, status, message); a server that stops answering or a
    stop signal ends it as "partial" after every finished record is on disk."""

    def __init__(self, server: Server, wl: Workload, rf: RunFolder, *, study: str, config_id: str,
                 sources: dict[str, Any], progress: bool = True, metrics_interval_s: float | None = 0.5,
                 resume: ResumeState | None = None, log: Callable[[str], None] | None = None,
                 gpu_devices: list[int] | None = None, counter: TokenCounter | None = None) -> None:
        self.server, self.wl, self.rf = server, wl, rf
        self.counter = counter  # counts the output of a stream without usage (None: it fails as no_usage)
        self.study, self.config_id, self.sources = study, config_id, sources
        self.progress, self.metrics_interval_s = progress, metrics_interval_s
        self.log = log or (lambda m: print(f"[servelab] {m}", file=sys.stderr, flush=True))
        self.gpu_devices = gpu_devices
        self.run_token = uuid.uuid4().hex[:12]
        self.grid = levels(wl)
        done = resume.done_levels if resume else set()
        self.plan = [(li, lv) for li, lv in enumerate(self.grid) if li not in done]
        self.seq = resume.next_seq if resume else 0
        self.stop = asyncio.Event()
        self.signals: list[str] = []
        self.in_flight: set[asyncio.Task[Any]] = set()
        self.status, self.message = "complete", ""
        self.samplers: list[Any] = []
        self.workers: list[dict[str, Any]] = []  # the pool's workers (run.json `workers`)

    # -- signals --------------------------------------------------------------------------
    def _on_signal(self, sig: signal.Signals) -> None:
        self.signals.append(sig.name)
        self.stop.set()
        if self.wl.on_interrupt == "cancel" or len(self.signals) > 1 or sig != signal.SIGINT:
            for t in list(self.in_flight):
                t.cancel()

    def _install_signals(self) -> bool:
        loop = asyncio.get_running_loop()
        self._previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
        try:
            for sig in STOP_SIGNALS:
                loop.add_signal_handler(sig, self._on_signal, sig)
            return True
        except (RuntimeError, ValueError, NotImplementedError):  # not the main thread (Jupyter)
            return False

    def _remove_signals(self) -> None:
        """Hand the signals back to whoever held them before the run (asyncio's own removal
        would reset them to the default action: a later SIGTERM would then kill the pipeline
        before its teardown)."""
        loop = asyncio.get_running_loop()
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)
            prev = self._previous.get(sig)
            if prev is not None:
                signal.signal(sig, prev)

    # -- one level ------------------------------------------------------------------------
    def _ctx(self, li: int, lv: Level, rnd: int, n: int) -> RoundCtx:
        wl = self.wl
        offsets = None
        if lv.rate_rps and lv.bucket.trace is None:
            offsets = arrival_offsets(wl, lv, n, (wl.seed or 0) + 1000 * li + rnd)
        return RoundCtx(self.run_token, li, rnd, lv.concurrency, lv.rate_rps, n, offsets, self.seq)

    def _job(self, d: Draft) -> Job:
        wl = self.wl
        spec = sc.RequestSpec(
            prompt=d.prompt, messages=d.messages, max_tokens=d.max_tokens, model=self.server.model, api=wl.api,
            temperature=wl.temperature, seed=wl.seed,
            ignore_eos=wl.ignore_eos if d.ignore_eos is None else d.ignore_eos, cache_salt=d.cache_salt,
            chat_template_kwargs=wl.chat_template_kwargs, continuous_usage_stats=wl.continuous_usage_stats,
            keep_text=d.keep_text)
        job = Job(self.seq, spec, d.at_s, d.meta)
        self.seq += 1
        return job

    def _jobs(self, li: int, lv: Level, rnd: int, n_req: int) -> list[Job]:
        return [self._job(d) for d in self.sources[lv.bucket.label].drafts(self._ctx(li, lv, rnd, n_req))]

    def _endless_jobs(self, li: int, lv: Level, rnd: int) -> Any:
        """Duration-bounded closed loop: drafts planned a concurrency's worth at a time, for ever."""
        while True:
            yield from self._jobs(li, lv, rnd, max(1, lv.concurrency))

    def _record(self, li: int, lv: Level, rnd: int, warm: bool, job: Job, res: Any, lag: float | None) -> dict[str, Any]:
        d = res if isinstance(res, dict) else res.to_dict()
        if self.counter is not None and d.get("error_kind") == sc.NO_USAGE:
            d = sc.count_on_client(d, self.counter.count_text)
        if not job.spec.keep_text:
            d.pop("output_text", None)
        return {"study": self.study, "config": self.config_id, "level": li, "bucket": lv.bucket.label,
                "target_input_tokens": lv.bucket.input_tokens or 0, "target_output_tokens": lv.bucket.output_tokens or 0,
                "shared_prefix": lv.bucket.shared_prefix, "concurrency": lv.concurrency, "rate_rps": lv.rate_rps,
                "arrival": "trace" if lv.bucket.trace else self.wl.arrival, "round": rnd, "warmup": warm,
                "seq": job.seq, "cache_salt": job.spec.cache_salt, "scheduled_s": job.at_s, "send_lag_s": lag,
                **job.meta, **d}

    async def _send_round(self, http: sc.StreamClient, pool: WorkerPool | None, li: int, lv: Level, rnd: int,
                          n_req: int, on_result: Callable[..., None], budget: Callable[[], bool] | None) -> dict[str, Any]:
        """One round through the bucket's source: a session round, or jobs (in this process or the pool)."""
        wl, src = self.wl, self.sources[lv.bucket.label]
        if not src.independent:
            if pool:
                raise RunAborted(f"bucket '{lv.bucket.label}': sessions run in the driver process only "
                                 "(workload.workers: 1)")

            async def send(d: Draft) -> sc.Result:
                job = self._job(d)
                res = await sc.send(http, job.spec, timeout_s=wl.timeout_s)
                on_result(job, res, None)
                return res

            with LoopMonitor() as mon:
                await src.run_round(self._ctx(li, lv, rnd, n_req), send, self.stop, budget)
            return mon.stats()
        if pool:
            return await pool.run_round(self._jobs(li, lv, rnd, n_req), lv.concurrency, wl.timeout_s, on_result)
        timed = wl.round_duration_s and not lv.rate_rps and lv.bucket.trace is None
        jobs = self._endless_jobs(li, lv, rnd) if timed else self._jobs(li, lv, rnd, n_req)
        return await run_round(http, jobs, lv.concurrency, wl.timeout_s, on_result, self.stop, budget,
                               duration_s=wl.round_duration_s if timed else None)

    async def _level(self, http: sc.StreamClient, pool: WorkerPool | None, li: int, lv: Level, w: JsonlWriter,
                     cw: JsonlWriter, lw: JsonlWriter, bar: Any) -> None:
        wl = self.wl
        n_rounds, n_req = wl.warmup_rounds + wl.rounds, requests_per_round(wl, lv)
        for s in self.samplers:
            s.set_level(lv.label)
        sent = failed = 0
        verdict = "complete"
        counters0 = None
        t0 = time.monotonic()
        before, t_measured = None, t0
        for rnd in range(n_rounds):
            warm = rnd < wl.warmup_rounds
            if rnd == wl.warmup_rounds:  # the engine's counters over the measured rounds only
                before, t_measured = await self._counters(), time.monotonic()
            bar.set_description(f"{self.config_id} {lv.label} {'warmup' if warm else 'round'} {rnd + 1}/{n_rounds}")
            results: list[dict[str, Any]] = []
            if rnd == wl.warmup_rounds:
                counters0 = await cache_counters(self.server)
            def on_result(job: Job, res: Any, lag: float | None) -> None:
                nonlocal sent, failed
                rec = self._record(li, lv, rnd, warm, job, res, lag)
                w.write(rec)
                results.append(rec)
                if not warm:
                    sent += 1
                    failed += 0 if rec["ok"] else 1
                bar.update(1)

            def budget_spent() -> bool:
                return bool(wl.failure_budget and sent >= 4 and failed / sent > wl.failure_budget)

            task = asyncio.ensure_future(self._send_round(http, pool, li, lv, rnd, n_req, on_result,
                                                          budget_spent if not warm else None))
            self.in_flight.add(task)
            try:
                stats = await task
            except asyncio.CancelledError:
                stats = {}
            finally:
                self.in_flight.discard(task)
            cw.write({"level": li, "label": lv.label, "round": rnd, "warmup": warm, "requests": len(results),
                      "workers": worker_count(wl.workers), **stats})
            if self.stop.is_set():
                how = "cancelled" if wl.on_interrupt == "cancel" or self.signals[-1:] != ["SIGINT"] else "drained"
                who = "the user (Ctrl-C)" if self.signals[-1:] == ["SIGINT"] else self.signals[-1]
                raise RunAborted(f"interrupted by {who} during level '{lv.label}' round {rnd + 1}; in-flight "
                                 f"requests {how}; {w.count} records kept in {self.rf / RECORDS}")
            if results and all(not r["ok"] and r["error_kind"] in SERVER_GONE for r in results):
                if not await _server_healthy(http):
                    kinds = sorted({r["error_kind"] for r in results})
                    raise RunAborted(
                        f"server at {self.server.base_url} stopped answering during level '{lv.label}' round "
                        f"{rnd + 1}: all {len(results)} requests failed ({', '.join(kinds)}: "
                        f"{results[-1]['error_detail']}); {w.count} records kept in {self.rf / RECORDS}")
            if not warm and budget_spent():
                verdict = (f"stopped early: {failed} of {sent} requests failed "
                           f"(> failure budget {wl.failure_budget:.0%})")
                self.message += f"level '{lv.label}': {verdict}. "
                self.status = "partial"
                break
        counters1 = await cache_counters(self.server) if counters0 else None
        cache = ({"prefix_cache_queries": counters1[0] - counters0[0], "prefix_cache_hits": counters1[1] - counters0[1]}
                 if counters0 and counters1 else {})
        lw.write({"level": li, "label": lv.label, "status": verdict, "sent": sent, "failed": failed, **cache,
                  **await self._counter_delta(before, t_measured)})
        k = self.plan.index((li, lv)) + 1
        self.log(f"{self.config_id}: level {k}/{len(self.plan)} {lv.label}: {sent} measured requests, "
                 f"{failed} failed, {time.monotonic() - t0:.1f} s" + (f" ({verdict})" if verdict != "complete" else ""))

    async def _counters(self) -> Any:
        """One /metrics scrape through the engine's mapping (None when the server has none)."""
        from .metrics import snapshot

        try:
            return await snapshot(self.server.base_url, self.server.headers)
        except Exception:  # counters are a bonus; a server without /metrics is still measured
            return None

    async def _counter_delta(self, before: Any, t_measured: float) -> dict[str, Any]:
        """levels.jsonl's `counters` (engine counter increments over the measured rounds, e.g. the
        speculative-decoding ones) and `measured_s`, their duration."""
        from .metrics import delta

        after = await self._counters() if before is not None else None
        if after is None:
            return {}
        return {"measured_s": time.monotonic() - t_measured, "counters": delta(before, after)}

    async def _start_samplers(self) -> None:
        if self.metrics_interval_s:
            from .metrics import MetricsSampler

            m = MetricsSampler(self.server.base_url, self.rf / SERVER_METRICS, interval_s=self.metrics_interval_s,
                               headers=self.server.headers)
            await m.__aenter__()
            self.samplers.append(m)
        if self.gpu_devices is not None:
            from .gpu import GpuSampler

            g = GpuSampler(self.rf / GPU_METRICS, devices=self.gpu_devices or None)
            g.__enter__()
            self.samplers.append(g)

    async def _stop_samplers(self) -> None:
        for s in reversed(self.samplers):
            if hasattr(s, "__aexit__"):
                await s.__aexit__(None, None, None)
            else:
                s.__exit__(None, None, None)

    async def run(self) -> tuple[int, str, str]:
        wl = self.wl
        have_handlers = self._install_signals()
        max_c = max(lv.concurrency for lv in self.grid)
        pool = None
        try:
            pool = make_pool(wl.workers, self.server, max_c)
            self.workers = pool.describe() if pool else []
            return await self._run_grid(max_c, pool)
        finally:  # the pool's workers (Ray actors, processes) end on every exit path
            if pool:
                pool.close()
                self.workers = pool.describe()
            if have_handlers:
                self._remove_signals()

    async def _run_grid(self, max_c: int, pool: Any) -> tuple[int, str, str]:
        wl = self.wl
        total = sum((wl.warmup_rounds + wl.rounds) * requests_per_round(wl, lv)
                    * (lv.bucket.session.turns if lv.bucket.session else 1) for _, lv in self.plan)
        bar = tqdm(total=total, desc=self.config_id, unit="req", disable=not self.progress, dynamic_ncols=True)
        async with sc.StreamClient(self.server.base_url, concurrency=min(max_c, 4096),
                                   headers=self.server.headers) as http:
            await self._start_samplers()
            w = self.rf.writer(RECORDS)
            try:
                with w, self.rf.writer(CLIENT_STATS) as cw, self.rf.writer(LEVELS) as lw:
                    for li, lv in self.plan:
                        await self._level(http, pool, li, lv, w, cw, lw, bar)
                return w.count, self.status, self.message.strip()
            except (RunAborted, PoolLost) as e:
                return w.count, "partial", str(e)
            finally:
                bar.close()
                await self._stop_samplers()


def open_run_folder(run_dir: Path, resume: bool) -> tuple[RunFolder, ResumeState | None]:
    """The run folder to write, created if new; with `resume`, an existing one prepared to continue
    (`prepare_resume`). Raises FileExistsError for an existing run without `resume` (runs are
    immutable)."""
    rf, state = RunFolder(run_dir), None
    if rf.exists(RECORDS):
        if not resume:
            raise FileExistsError(f"{rf / RECORDS} exists: runs are immutable; remove the folder, use a new id "
                                  "or --resume")
        state = prepare_resume(rf.path)
    rf.path.mkdir(parents=True, exist_ok=True)
    return rf, state


def run_workload(server: Server, wl: Workload, run_dir: Path, *, study: str, config_id: str,
                 record: dict[str, Any], progress: bool = True, metrics_interval_s: float | None = None,
                 log: Callable[[str], None] | None = None, resume: bool = False,
                 gpu_devices: list[int] | None = None,
                 before_final: Callable[[dict[str, Any]], None] | None = None) -> RunResult:
    """Calibrate prompts, run the grid, write run.json (running at the start, then once more at
    the end with the status, headline and summary). Never loses records: on abort, a stop
    signal or Ctrl-C, run.json is written with status 'partial' and the reason.
    `metrics_interval_s` overrides the workload's /metrics sampling period (0 = off);
    `gpu_devices` (a list, [] = all) samples those GPUs through NVML; `before_final(record)`
    adds what the caller measured beside the run (e.g. the engine's peak RSS)."""
    if metrics_interval_s is None:
        metrics_interval_s = wl.metrics_interval_s
    log = log or (lambda m: print(f"[servelab] {m}", file=sys.stderr, flush=True))
    rf, state = open_run_folder(run_dir, resume)
    counter = server_counter(server, wl, warn=log)
    sources = make_sources(server, wl, warn=log, counter=counter)
    cal = {k: v.calibration() for k, v in sources.items()}
    if state and rf.run:
        prev = rf.run
        record.setdefault("resumed", []).extend(prev.get("resumed", []))
        record["resumed"].append({"at": now_iso(), "skipped_levels": sorted(state.done_levels),
                                  "previous_status": prev.get("status")})
        record["started_at"] = prev.get("started_at", record.get("started_at"))
    record.update({"server": server.info, "model_name": server.model, "workload": wl.model_dump(),
                   "calibration": cal, "status": "running"})
    rf.write_run(record)
    status, message = "failed", ""
    t0 = now_iso()
    lr = LevelRunner(server, wl, rf, study=study, config_id=config_id, sources=sources, progress=progress,
                     metrics_interval_s=metrics_interval_s, resume=state, log=log, gpu_devices=gpu_devices,
                     counter=counter)
    try:
        _, status, message = run_sync(lr.run())
    except KeyboardInterrupt:
        status, message = "partial", "interrupted by the user (Ctrl-C)"
        raise
    finally:
        if lr.workers:
            record["workers"] = lr.workers
        if before_final:
            before_final(record)
        summ = finalize(rf, record, status=status, message=message, measured_from=t0)
    return RunResult(rf.path, status, record["records"], summ, message, cal)


def finalize(rf: RunFolder, record: dict[str, Any], *, status: str, message: str,
             measured_from: str | None = None) -> Any:
    """Write run.json's closing fields from what the folder holds (status, reason, record count,
    headline, client-limited levels); returns the summary. Also used by the pipeline when a
    stage process died before it could write them itself."""
    rf.invalidate()
    summ = rf.summary
    record.update({"status": status, "message": message, "finished_at": now_iso(), "records": len(rf.records),
                   "headline": _headline(summ), "client_limited_levels": client_limited(rf.path)})
    if measured_from:
        record["measured_from"] = measured_from
    rf.write_run(record)
    return summ


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
