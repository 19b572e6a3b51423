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
import contextlib
import signal
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import AsyncIterator
from typing import Any, Callable

from tqdm.auto import tqdm

from ..log import progress_line
from ..hosts.base import Server
from ..runfolder import (CLIENT_STATS, GPU_METRICS, LEVELS, RECORDS, SERVER_METRICS, JsonlWriter, RunFolder,
                         now_iso)
from .runfiles import ResumeState, finalize, open_run_folder, warming_reason
from ..schema import Workload
from ..schema.runfiles import RequestOutcome, RequestRecord
from ..summary import one_prompt_length, still_warming
from . import client
from ..errors import ServelabError
from .grid import Level, cache_counters, arrival_offsets, levels, make_sources, requests_per_round
from .pools import make_pool, worker_count
from .rounds import Job, LoopMonitor, PoolLost, run_round, run_sync
from .sources import Draft, RoundCtx
from .sources.canary import canary_drafts
from .workers import WorkerPool
from .workload import TokenCounter, token_counter

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

SERVER_GONE = {client.CONNECT, client.DISCONNECT, client.TIMEOUT}



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


async def _server_healthy(c: client.StreamClient) -> bool:
    for path in ("/health", "/v1/models"):
        if await c.status(path) == 200:
            return True
    return False


class LevelRunner:
    """Sends the grid of one configuration, level by level, writing every record as it ends.

    `run()` returns (records written, status, message); a server that stops answering or a
    stop signal ends it as "partial" after every finished record is on disk."""

    def __init__(self, server: Server, wl: Workload, rf: RunFolder, *, study: str, config_id: str,
                 sources: dict[str, Any], progress: bool = True, metrics_interval_s: float | None = 0.5,
                 resume: ResumeState | None = None, log: Callable[[str], None] | None = None,
                 gpu_devices: list[int] | None = None, counter: TokenCounter | None = None,
                 only: tuple[int, Level] | None = None, first_seq: int | None = None) -> None:
        """`only`: send this one level (index, Level) instead of the workload's grid (a capacity
        trial); `first_seq`: the first request's sequence number (after an earlier runner's)."""
        self.server, self.wl, self.rf = server, wl, rf
        self.counter = counter  # counts the output of a stream without usage (None: it fails as no_usage)
        self.study, self.config_id, self.sources = study, config_id, sources
        self.progress, self.metrics_interval_s = progress, metrics_interval_s
        self.log = log or progress_line
        self.gpu_devices = gpu_devices
        self.run_token = uuid.uuid4().hex[:12]
        self.grid = [only[1]] if only else levels(wl)
        done = resume.done_levels if resume else set()
        self.plan = [only] if only else [(li, lv) for li, lv in enumerate(self.grid) if li not in done]
        self.seq = first_seq if first_seq is not None else resume.next_seq if resume else 0
        self.stop = asyncio.Event()
        self.signals: list[str] = []
        self.in_flight: set[asyncio.Task[Any]] = set()
        self.status, self.message = "complete", ""
        self.stopped_early: list[str] = []  # levels the failure budget ended (the run goes on: "partial")
        self.samplers: list[Any] = []
        self.workers: list[dict[str, Any]] = []  # the pool's workers (run.json `workers`)

    # -- signals --------------------------------------------------------------------------
    def on_signal(self, sig: signal.Signals) -> None:
        self.signals.append(sig.name)
        self.stop.set()
        if self.wl.on_interrupt == "cancel" or len(self.signals) > 1 or sig != signal.SIGINT:
            for t in list(self.in_flight):
                t.cancel()

    def install_signals(self) -> bool:
        loop = asyncio.get_running_loop()
        self._previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
        try:
            for sig in STOP_SIGNALS:
                loop.add_signal_handler(sig, self.on_signal, sig)
            return True
        except (RuntimeError, ValueError, NotImplementedError):  # not the main thread (Jupyter)
            return False

    def remove_signals(self) -> None:
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

    def _job(self, d: Draft, warm: bool = False) -> Job:
        wl = self.wl
        short = warm and wl.warmup_max_tokens and not d.meta.get("canary")  # a canary answers in full
        cap = wl.warmup_max_tokens if short else d.max_tokens
        spec = client.RequestSpec(
            prompt=d.prompt, messages=d.messages, max_tokens=min(d.max_tokens, cap), model=self.server.model, api=wl.api,
            temperature=wl.temperature, seed=wl.seed,
            ignore_eos=wl.ignore_eos if d.ignore_eos is None else d.ignore_eos, cache_salt=d.cache_salt,
            chat_template_kwargs=wl.chat_template_kwargs, continuous_usage_stats=wl.continuous_usage_stats,
            keep_text=d.keep_text, extra_body=dict(d.extra_body))
        job = Job(self.seq, spec, d.at_s, d.meta)
        self.seq += 1
        return job

    def _jobs(self, li: int, lv: Level, rnd: int, n_req: int) -> list[Job]:
        warm = rnd < self.wl.warmup_rounds
        ctx = self._ctx(li, lv, rnd, n_req)
        src = self.sources[lv.bucket.label]
        if (warm and self.wl.canaries and lv.concurrency > 1 and rnd == self.wl.warmup_rounds - 1
                and getattr(src, "kind", "") in ("prompt_set", "filler")):
            drafts = canary_drafts(lv.bucket, self.wl, ctx)  # the last warm-up round: the load's own batches
        else:
            drafts = src.drafts(ctx)
        return [self._job(d, warm) for d in drafts]

    def _endless_jobs(self, li: int, lv: Level, rnd: int) -> Any:
        """Duration-bounded closed loop: drafts planned a concurrency's worth at a time, for ever."""
        while True:
            yield from self._jobs(li, lv, rnd, max(1, lv.concurrency))

    def record(self, li: int, lv: Level, rnd: int, warm: bool, job: Job, res: RequestOutcome | dict[str, Any],
               lag: float | None, attempt: int = 0) -> RequestRecord:
        """The request's record: the client's outcome (a worker process sends its dump) counted on the
        client when the stream had no usage, with where it ran (level, round, send schedule) and the
        source's keys. The answer's text is kept only when the request asked for it."""
        out = res if isinstance(res, RequestOutcome) else RequestOutcome.model_validate(res)
        if self.counter is not None and out.error_kind == client.NO_USAGE:
            out = client.count_on_client(out, self.counter.count_text)
        drop = {"output_text"} if not job.spec.keep_text else set()
        if out.output_token_ids is None:
            drop.add("output_token_ids")
        b = lv.bucket
        return RequestRecord.model_validate({
            "study": self.study, "config": self.config_id, "level": li, "bucket": b.label,
            "target_input_tokens": b.input_tokens or 0, "target_output_tokens": b.output_tokens or 0,
            "shared_prefix": b.shared_prefix, "concurrency": lv.concurrency, "rate_rps": lv.rate_rps,
            "arrival": "trace" if b.trace else self.wl.arrival, "round": rnd, "warmup": warm,
            **({"attempt": attempt} if attempt else {}), "seq": job.seq, "cache_salt": job.spec.cache_salt,
            "scheduled_s": job.at_s, "send_lag_s": lag, **job.meta, **out.model_dump(exclude=drop)})

    async def _send_round(self, http: client.StreamClient, pool: WorkerPool | None, li: int, lv: Level, rnd: int,
                          n_req: int, on_result: Callable[..., None], budget: Callable[[], bool] | None) -> dict[str, Any]:
        """One round through the bucket's source: a session round, or jobs (in this process or the pool)."""
        wl, src = self.wl, self.sources[lv.bucket.label]
        if not src.independent:
            if pool:
                raise RunAborted(f"bucket '{lv.bucket.label}': sessions run in the driver process only "
                                 "(workload.workers: 1)")

            async def send(d: Draft) -> RequestOutcome:
                job = self._job(d)
                res = await client.send(http, job.spec, timeout_s=wl.timeout_s)
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
                               duration_s=wl.round_duration_s if timed else None,
                               ramp_s=0.0 if lv.rate_rps else float(wl.concurrency_ramp_s or 0.0))

    async def level_begin(self, li: int, lv: Level) -> "LevelState":
        """A level starts: its samples are labelled with it (`level_end` closes it)."""
        for s in self.samplers:
            s.set_level(lv.label)
        return LevelState(li, lv, t0=time.monotonic(), failure_budget=self.wl.failure_budget)

    async def level_round(self, st: "LevelState", rnd: int, meter: Any = None, attempt: int = 0
                          ) -> list[RequestRecord]:
        """One round of the level (a warm-up round while `rnd < warmup_rounds`): its records written
        as they end and returned; its client stats (and `meter.stop()`'s, when given: what a caller
        measured around it, e.g. what else used the CPU; kept on the meter as `result`) to
        client_stats.jsonl. `attempt` > 0: the round measured again (the same prompts; records and
        stats say which attempt). Raises RunAborted when a stop signal arrived or the server stopped
        answering."""
        wl, li, lv, w = self.wl, st.li, st.lv, self.out.records
        warm = rnd < wl.warmup_rounds
        n_req = requests_per_round(wl, lv)
        for s in self.samplers:
            s.set_level(lv.label)
        if not warm and not st.measuring:  # the engine's counters over the measured rounds only
            st.measuring = True
            st.before, st.t_measured = await self._counters(), time.monotonic()
            st.counters0 = await cache_counters(self.server)
        self.bar.set_description(f"{self.config_id} {lv.label} {'warmup' if warm else 'round'} {rnd + 1}")
        results: list[RequestRecord] = []

        def on_result(job: Job, res: RequestOutcome | dict[str, Any], lag: float | None) -> None:
            rec = self.record(li, lv, rnd, warm, job, res, lag, attempt)
            w.write(rec)
            results.append(rec)
            if not rec.warmup:  # a round's warm-up, or a ramp request while the loop fills
                st.sent += 1
                st.failed += 0 if rec.ok else 1
            self.bar.update(1)

        if meter is not None:
            meter.start()
        task = asyncio.ensure_future(self._send_round(self.out.http, self.out.pool, li, lv, rnd, n_req, on_result,
                                                      st.budget_spent if not warm else None))
        self.in_flight.add(task)
        try:
            stats = await task
        except asyncio.CancelledError:
            stats = {}
        finally:
            self.in_flight.discard(task)
        extra = meter.stop() if meter is not None else {}
        if meter is not None:
            meter.result = {**stats, **extra}
        self.out.stats.write({"level": li, "label": lv.label, "round": rnd, **({"attempt": attempt} if attempt else {}),
                              "warmup": warm, "requests": len(results), "workers": worker_count(wl.workers),
                              **stats, **extra})
        await self._after_round(st, rnd, warm, results)
        return results

    async def _after_round(self, st: "LevelState", rnd: int, warm: bool, results: list[RequestRecord]) -> None:
        """What a round's end decides: RunAborted on a stop signal or when the server stopped answering
        (the records so far kept); a level past its failure budget stops early (the run is partial)."""
        wl, lv, w = self.wl, st.lv, self.out.records
        if self.stop.is_set():
            how = "cancelled" if wl.on_interrupt == "cancel" or self.signals[-1:] != ["SIGINT"] else "drained"
            who = "the user (Ctrl-C)" if self.signals[-1:] == ["SIGINT"] else self.signals[-1]
            raise RunAborted(f"interrupted by {who} during level '{lv.label}' round {rnd + 1}; in-flight "
                             f"requests {how}; {w.count} records kept in {self.rf / RECORDS}")
        if results and all(not r.ok and r.error_kind in SERVER_GONE for r in results):
            if not await _server_healthy(self.out.http):
                kinds = sorted({str(r.error_kind) for r in results})
                raise RunAborted(
                    f"server at {self.server.base_url} stopped answering during level '{lv.label}' round "
                    f"{rnd + 1}: all {len(results)} requests failed ({', '.join(kinds)}: "
                    f"{results[-1].error_detail}); {w.count} records kept in {self.rf / RECORDS}")
        if not warm and st.budget_spent():
            st.verdict = (f"stopped early: {st.failed} of {st.sent} requests failed "
                          f"(> failure budget {wl.failure_budget:.0%})")
            self.message += f"level '{lv.label}': {st.verdict}. "
            self.status = "partial"
            self.stopped_early.append(lv.label)

    async def level_end(self, st: "LevelState", **extra: Any) -> None:
        """The level's line in levels.jsonl (what --resume skips; `extra` adds fields, e.g. how
        its sampling stopped) and its line on the terminal."""
        lv = st.lv
        counters1 = await cache_counters(self.server) if st.counters0 else None
        cache = ({"prefix_cache_queries": counters1[0] - st.counters0[0], "prefix_cache_hits": counters1[1] - st.counters0[1]}
                 if st.counters0 and counters1 else {})
        self.out.levels.write({"level": st.li, "label": lv.label, "status": st.verdict, "sent": st.sent,
                               "failed": st.failed, **cache, **await self._counter_delta(st.before, st.t_measured),
                               **extra})
        k = self.plan.index((st.li, lv)) + 1
        self.log(f"{self.config_id}: level {k}/{len(self.plan)} {lv.label}: {st.sent} measured requests, "
                 f"{st.failed} failed, {time.monotonic() - st.t0:.1f} s"
                 + (f" ({st.verdict})" if st.verdict != "complete" else ""))

    async def _level(self, li: int, lv: Level) -> None:
        """A level's warm-up and measured rounds; measured once more when it was still warming up
        (`warming_again`)."""
        st = await self.level_begin(li, lv)
        wl, got = self.wl, []
        for rnd in range(wl.warmup_rounds + wl.rounds):
            got += await self.level_round(st, rnd)
            if st.verdict != "complete":
                break
        again = self.warming_again(lv, got) if st.verdict == "complete" else []
        if again:  # the first pass's records are marked from the level's line when the run folder closes
            self.log(f"{self.config_id}: level {lv.label} {warming_reason(again)}")
            for rnd in range(wl.warmup_rounds, wl.warmup_rounds + wl.rounds):
                await self.level_round(st, rnd, attempt=1)
                if st.verdict != "complete":
                    break
        await self.level_end(st, **({"warming_ttft_s": again} if again else {}))

    def warming_again(self, lv: Level, got: list[RequestRecord]) -> list[float]:
        """The measured TTFTs of a one-request-at-a-time level, in order, when they read as a server
        still warming up after the level's warm-up rounds (`summary.still_warming`: a level right after the
        server started, or the first of a new prompt length); [] otherwise, and without warm-up rounds. Such a
        level is measured once more, its first pass kept in the run folder and left out of every result (its
        records' `disturbed` says why)."""
        if lv.concurrency != 1 or lv.rate_rps or lv.bucket.trace is not None or self.wl.warmup_rounds < 1:
            return []  # without warm-up rounds the user asked for a cold server's figures
        done = [r for r in sorted(got, key=lambda r: r.seq) if not r.warmup and r.ok and r.ttft_s is not None]
        t = [float(r.ttft_s) for r in done]
        return (t if len(done) == len([r for r in got if not r.warmup])
                and one_prompt_length([r.prompt_tokens for r in done]) and still_warming(t) else [])

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
        have_handlers = self.install_signals()
        try:
            async with self.session():
                try:
                    for li, lv in self.plan:
                        await self._level(li, lv)
                    return self.out.records.count, self.status, self.message.strip()
                except (RunAborted, PoolLost) as e:
                    return self.out.records.count, "partial", str(e)
        finally:
            if have_handlers:
                self.remove_signals()

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator["Outputs"]:
        """Everything a run holds open: the pool's workers (Ray actors, processes), the HTTP client,
        the samplers and the run folder's writers; closed on every exit path."""
        wl = self.wl
        max_c = max(lv.concurrency for lv in self.grid)
        total = sum((wl.warmup_rounds + wl.rounds) * requests_per_round(wl, lv)
                    * (lv.bucket.session.turns if lv.bucket.session else 1) for _, lv in self.plan)
        self.bar = tqdm(total=total, desc=self.config_id, unit="req", disable=not self.progress, dynamic_ncols=True)
        pool = None
        try:
            pool = make_pool(wl.workers, self.server, max_c)
            self.workers = pool.describe() if pool else []
            async with client.StreamClient(self.server.base_url, concurrency=min(max_c, 4096),
                                       headers=self.server.headers) as http:
                await self._start_samplers()
                try:
                    with self.rf.writer(RECORDS) as w, self.rf.writer(CLIENT_STATS) as cw, self.rf.writer(LEVELS) as lw:
                        self.out = Outputs(http, pool, w, cw, lw)
                        yield self.out
                finally:
                    await self._stop_samplers()
        finally:
            self.bar.close()
            if pool:
                pool.close()
                self.workers = pool.describe()


@dataclass
class Outputs:
    """What `LevelRunner.session` holds open for its levels."""

    http: client.StreamClient
    pool: WorkerPool | None
    records: JsonlWriter
    stats: JsonlWriter
    levels: JsonlWriter


@dataclass
class LevelState:
    """One level in progress: its measured requests and failures, its verdict ("complete" or why
    it stopped early), the engine counters read where its measured rounds began."""

    li: int
    lv: Level
    t0: float
    sent: int = 0
    failed: int = 0
    verdict: str = "complete"
    counters0: Any = None
    before: Any = None
    t_measured: float = 0.0
    measuring: bool = False
    failure_budget: float | None = None

    def budget_spent(self) -> bool:
        return bool(self.failure_budget and self.sent >= 4 and self.failed / self.sent > self.failure_budget)


@dataclass
class Prepared:
    """A run folder opened for one server's grid: the runner, the run.json record being built and
    when its measurement began (`prepare_run`, then `finish_run`)."""

    rf: RunFolder
    runner: LevelRunner
    record: dict[str, Any]
    started: str
    calibration: dict[str, Any]
    before_final: Callable[[dict[str, Any]], None] | None = None


def prepare_run(server: Server, wl: Workload, run_dir: Path, *, study: str, config_id: str,
                record: dict[str, Any], progress: bool = True, metrics_interval_s: float | None = None,
                log: Callable[[str], None] | None = None, resume: bool = False,
                gpu_devices: list[int] | None = None,
                before_final: Callable[[dict[str, Any]], None] | None = None) -> Prepared:
    """Open the run folder (`open_run_folder`), calibrate the workload's sources on this server and
    write run.json as running; returns the runner that sends the grid."""
    if metrics_interval_s is None:
        metrics_interval_s = wl.metrics_interval_s
    log = log or progress_line
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
    lr = LevelRunner(server, wl, rf, study=study, config_id=config_id, sources=sources, progress=progress,
                     metrics_interval_s=metrics_interval_s, resume=state, log=log, gpu_devices=gpu_devices,
                     counter=counter)
    return Prepared(rf, lr, record, now_iso(), cal, before_final)


def finish_run(p: Prepared, status: str, message: str) -> RunResult:
    """run.json's closing write (`finalize`) with what the caller measured beside the run."""
    if p.runner.workers:
        p.record["workers"] = p.runner.workers
    if p.before_final:
        p.before_final(p.record)
    summ = finalize(p.rf, p.record, status=status, message=message, measured_from=p.started)
    return RunResult(p.rf.path, status, p.record["records"], summ, message, p.calibration)


def run_workload(server: Server, wl: Workload, run_dir: Path, **kw: Any) -> RunResult:
    """Calibrate prompts, run the grid, write run.json (running at the start, then once more at
    the end with the status, headline and summary). Never loses records: on abort, a stop
    signal or Ctrl-C, run.json is written with status 'partial' and the reason. Keywords as
    `prepare_run`: `metrics_interval_s` overrides the workload's /metrics sampling period
    (0 = off); `gpu_devices` (a list, [] = all) samples those GPUs through NVML;
    `before_final(record)` adds what the caller measured beside the run (the engine's peak RSS)."""
    p = prepare_run(server, wl, run_dir, **kw)
    status, message = "failed", ""
    try:
        _, status, message = run_sync(p.runner.run())
    except KeyboardInterrupt:
        status, message = "partial", "interrupted by the user (Ctrl-C)"
        raise
    finally:
        res = finish_run(p, status, message)
    return res


