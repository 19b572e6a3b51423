"""Run a workload grid against one server and write the raw run folder.

For each bucket (input x output tokens) and each concurrency level: warmup rounds (kept in
the records, flagged, excluded from results) then measured rounds of n = k x c requests
sent by c workers. Each request's record is appended to `records.jsonl` as it ends;
`/metrics` is sampled in the background into `server_metrics.jsonl`; `run.json` is written
at the start (status running) and rewritten at the end (complete, partial or failed).
Not for starting engines (`engine`) or for the notebook/report layer.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import httpx
from tqdm.auto import tqdm

from . import client as sc
from .config import Bucket, Workload
from .engine import Server
from .records import RECORDS, RUN_JSON, SERVER_METRICS, SUMMARY_CSV, RecordWriter, load_records, write_json
from .runinfo import now_iso
from .summary import summarize
from .workload import Calibrated, calibrate, token_counter

SERVER_GONE = {sc.CONNECT, sc.DISCONNECT, sc.TIMEOUT}


class RunAborted(RuntimeError):
    """The run stopped before its grid was complete (server gone, interrupted)."""


@dataclass
class Level:
    bucket: Bucket
    concurrency: int

    @property
    def label(self) -> str:
        return f"{self.bucket.label} c={self.concurrency}"


@dataclass
class RunResult:
    run_dir: Path
    status: str
    records: int
    summary: Any
    message: str = ""
    calibration: dict[str, Any] = field(default_factory=dict)


def levels(wl: Workload) -> list[Level]:
    return [Level(b, c) for b in wl.buckets for c in wl.concurrency]


def calibrate_buckets(server: Server, wl: Workload, warn: Callable[[str], None] = print) -> dict[str, Calibrated]:
    counter = token_counter(server.base_url, server.model, wl.api, server.headers, server.tokenizer_dir,
                            wl.chat_template_kwargs, warn=warn)
    return {b.label: calibrate(counter, b.input_tokens, wl.prompt_text) for b in wl.buckets}


async def _server_healthy(c: httpx.AsyncClient) -> bool:
    for path in ("/health", "/v1/models"):
        try:
            r = await c.get(path, timeout=5.0)
            if r.status_code == 200:
                return True
        except httpx.HTTPError:
            pass
    return False


async def run_levels(server: Server, wl: Workload, run_dir: Path, *, study: str, config_id: str,
                     prompts: dict[str, Calibrated], progress: bool = True,
                     metrics_interval_s: float | None = 0.5) -> tuple[int, str]:
    """Send the grid; returns (records written, status). Raises RunAborted after writing
    every finished record when the server stops answering."""
    run_token = uuid.uuid4().hex[:12]
    grid = levels(wl)
    per_level = [(lv, wl.warmup_rounds + wl.rounds, lv.concurrency * wl.requests_per_round) for lv in grid]
    total = sum(r * n for _, r, n in per_level)
    seq = 0
    sampler_cm: Any = None
    if metrics_interval_s:
        from .metrics import MetricsSampler

        sampler_cm = MetricsSampler(server.base_url, run_dir / SERVER_METRICS, interval_s=metrics_interval_s,
                                    headers=server.headers)
    max_c = max(wl.concurrency)
    bar = tqdm(total=total, desc=config_id, unit="req", disable=not progress, dynamic_ncols=True)
    async with sc.make_client(server.base_url, concurrency=max_c, headers=server.headers) as http:
        sampler = await sampler_cm.__aenter__() if sampler_cm else None
        try:
            with RecordWriter(run_dir / RECORDS) as w:
                for li, (lv, n_rounds, n_req) in enumerate(per_level):
                    cal = prompts[lv.bucket.label]
                    if sampler:
                        sampler.set_level(lv.label)
                    for rnd in range(n_rounds):
                        warm = rnd < wl.warmup_rounds
                        bar.set_description(f"{config_id} {lv.label} {'warmup' if warm else 'round'} {rnd + 1}/{n_rounds}")
                        queue: asyncio.Queue[int] = asyncio.Queue()
                        for _ in range(n_req):
                            queue.put_nowait(seq)
                            seq += 1
                        results: list[dict[str, Any]] = []

                        async def worker() -> None:
                            while True:
                                try:
                                    s = queue.get_nowait()
                                except asyncio.QueueEmpty:
                                    return
                                salt = None
                                if wl.cache_salt:
                                    salt = f"{run_token}-{lv.bucket.label}" if lv.bucket.shared_prefix else f"{run_token}-{s}"
                                spec = sc.RequestSpec(
                                    prompt=cal.prompt, max_tokens=lv.bucket.output_tokens, model=server.model,
                                    api=wl.api, temperature=wl.temperature, seed=wl.seed, ignore_eos=wl.ignore_eos,
                                    cache_salt=salt, chat_template_kwargs=wl.chat_template_kwargs,
                                    continuous_usage_stats=wl.continuous_usage_stats)
                                res = await sc.send(http, spec, timeout_s=wl.timeout_s)
                                rec = {
                                    "study": study, "config": config_id, "level": li, "bucket": lv.bucket.label,
                                    "target_input_tokens": lv.bucket.input_tokens,
                                    "target_output_tokens": lv.bucket.output_tokens,
                                    "shared_prefix": lv.bucket.shared_prefix, "concurrency": lv.concurrency,
                                    "round": rnd, "warmup": warm, "seq": s, "cache_salt": salt,
                                    **res.to_dict(),
                                }
                                w.write(rec)
                                results.append(rec)
                                bar.update(1)

                        await asyncio.gather(*(worker() for _ in range(lv.concurrency)))
                        if results and all(not r["ok"] and r["error_kind"] in SERVER_GONE for r in results):
                            if not await _server_healthy(http):
                                kinds = sorted({r["error_kind"] for r in results})
                                raise RunAborted(
                                    f"server at {server.base_url} stopped answering during level '{lv.label}' "
                                    f"round {rnd + 1}: all {len(results)} requests failed ({', '.join(kinds)}: "
                                    f"{results[-1]['error_detail']}); {w.count} records kept in {run_dir / RECORDS}")
                return w.count, "complete"
        finally:
            bar.close()
            if sampler_cm:
                await sampler_cm.__aexit__(None, None, None)


def run_workload(server: Server, wl: Workload, run_dir: Path, *, study: str, config_id: str,
                 record: dict[str, Any], progress: bool = True, metrics_interval_s: float | None = 0.5,
                 log: Callable[[str], None] = print) -> RunResult:
    """Calibrate prompts, run the grid, write summary.csv and run.json. Never loses records:
    on abort or Ctrl-C the summary and run.json are written with status 'partial'."""
    run_dir = Path(run_dir)
    if (run_dir / RECORDS).exists():
        raise FileExistsError(f"{run_dir / RECORDS} exists: runs are immutable; remove the folder or use a new id")
    run_dir.mkdir(parents=True, exist_ok=True)
    prompts = calibrate_buckets(server, wl, warn=log)
    cal = {k: {"target_tokens": v.target_tokens, "tokens": v.tokens, "counter": v.counter, "probes": v.probes,
               "prompt_chars": len(v.prompt)} for k, v in prompts.items()}
    record.update({"server": server.info, "model_name": server.model, "workload": wl.model_dump(),
                   "calibration": cal, "status": "running"})
    write_json(run_dir / RUN_JSON, record)
    status, message, n = "failed", "", 0
    t0 = now_iso()
    try:
        n, status = run_sync(run_levels(server, wl, run_dir, study=study, config_id=config_id, prompts=prompts,
                                           progress=progress, metrics_interval_s=metrics_interval_s))
    except RunAborted as e:
        status, message = "partial", str(e)
    except KeyboardInterrupt:
        status, message = "partial", "interrupted by the user (Ctrl-C)"
        raise
    finally:
        df = load_records(run_dir)
        summ = summarize(df)
        if not summ.empty:
            summ.to_csv(run_dir / SUMMARY_CSV, index=False)
        n = len(df)
        record.update({
            "status": status if status != "failed" or message else status, "message": message,
            "measured_from": t0, "finished_at": now_iso(), "records": n,
            "headline": _headline(summ),
        })
        write_json(run_dir / RUN_JSON, record)
    return RunResult(run_dir, status, n, summ, message, cal)


def run_sync(coro: Any) -> Any:
    """asyncio.run, also from inside a running loop (Jupyter): then in a worker thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        return ex.submit(asyncio.run, coro).result()


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
