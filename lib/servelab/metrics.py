"""Scrape and normalise the Prometheus ``/metrics`` endpoint of vLLM and SGLang servers.

What this module is for
-----------------------
* Turning one ``/metrics`` exposition text into one engine-neutral record,
  :class:`ServerSample` (``parse_metrics``), so a benchmark can look at KV-cache
  pressure, queueing, preemptions, prefix-cache reuse and speculative decoding the
  same way for both engines.
* Sampling that record in the background during a benchmark run and appending it to
  a JSON-lines file (:class:`MetricsSampler`), tagged with the load level that was
  running at that moment, then reading the file back (:func:`load_samples`).
* Counter arithmetic between two samples (:func:`delta`), e.g. to assert that the
  prefix cache served zero hits during a run that is meant to be cache-free.

What it is not for
------------------
* It is not a Prometheus server or a time-series store: no rate()/histogram_quantile().
  Histograms are kept only as ``*_sum_s``/``*_count`` pairs (mean = Δsum/Δcount);
  client-side latency percentiles come from servelab's own request timing.
* It does not start, stop or configure servers, and it does not validate that the
  server is healthy. SGLang only exposes ``/metrics`` with ``--enable-metrics``.

Name mapping (checked against upstream sources)
-----------------------------------------------
vLLM V1 engine (``vllm/v1/metrics/loggers.py``, ``vllm/v1/spec_decode/metrics.py``):
labels ``model_name`` and ``engine`` (one value per data-parallel engine core).

* ``vllm:kv_cache_usage_perc`` -- HELP text "KV-cache usage. 1 means 100 percent
  usage.": a 0..1 *fraction* despite the ``_perc`` suffix (pre-0.10 fallback:
  ``vllm:gpu_cache_usage_perc``, same semantics).
* ``vllm:num_requests_running`` / ``vllm:num_requests_waiting`` (gauges).
* counters ``vllm:num_preemptions``, ``vllm:prefix_cache_queries``,
  ``vllm:prefix_cache_hits`` (both in *tokens*), ``vllm:prompt_tokens``,
  ``vllm:generation_tokens``, ``vllm:spec_decode_num_drafts``,
  ``vllm:spec_decode_num_draft_tokens``, ``vllm:spec_decode_num_accepted_tokens``
  (all exposed with a ``_total`` sample suffix).
* ``vllm:cache_config_info`` -- a gauge fixed at 1 whose *labels* carry the
  CacheConfig as strings (``block_size="16"``, ``num_gpu_blocks="2048"``, ...).
* histograms ``vllm:time_to_first_token_seconds``,
  ``vllm:inter_token_latency_seconds`` (older/deprecated twin:
  ``vllm:time_per_output_token_seconds``; some versions emit both with identical
  data, so the new name wins and the two are never added),
  ``vllm:request_prefill_time_seconds``, ``vllm:request_queue_time_seconds``,
  ``vllm:e2e_request_latency_seconds``.

SGLang (``python/sglang/srt/metrics/collector.py``, docs "Production Metrics"):
scheduler gauges carry ``model_name``, ``engine_type``, ``tp_rank``, ``pp_rank``
(+ ``moe_ep_rank``/``dp_rank`` in newer versions); tokenizer counters carry
``model_name`` (+ ``cache_source`` on ``sglang:cached_tokens_total``).

* ``sglang:token_usage`` (0..1 fraction of the KV pool), ``sglang:num_running_reqs``,
  ``sglang:num_queue_reqs``, ``sglang:cache_hit_rate`` (prefix-cache hit rate of the
  last logged *batch*, not cumulative), ``sglang:spec_accept_length`` (average
  accepted tokens per verify step over the last log interval),
  ``sglang:max_total_num_tokens`` (KV capacity in tokens).
* ``sglang:num_retracted_reqs`` is a *gauge* (retractions since the previous log
  line, reset to 0 after each log), so it is kept as ``retracted_reqs`` and NOT used
  as a cumulative counter. ``preemptions_total`` comes from the counter
  ``sglang:num_retracted_requests_total`` (newer SGLang) and is None without it.
* ``sglang:prompt_tokens_total``, ``sglang:generation_tokens_total``,
  ``sglang:cached_tokens_total`` (-> ``prefix_cache_hits_total``; summed over
  ``cache_source``). These tokenizer-side counters advance when a request finishes.

Aggregation across label sets
-----------------------------
Counters and count gauges (running, waiting, capacities) are summed over label
sets (several engines, models or DP ranks). Fractions/averages (``kv_usage_frac``,
``cache_hit_rate``, ``spec_accept_length``) are averaged, because summing 0..1
fractions of equal-sized per-engine pools would exceed 1. SGLang series that differ
only in ``tp_rank`` are mirrors of one scheduler (``--enable-metrics-for-all-schedulers``)
and are counted once (lowest ``tp_rank``). ``num_gpu_blocks``/``block_size`` are
per-engine config values taken from the lowest ``engine`` label; ``kv_capacity_tokens``
is the total over engines.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import os
import re
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Literal

import httpx
import pandas as pd
from prometheus_client.parser import text_string_to_metric_families

__all__ = [
    "ServerSample",
    "SAMPLE_FIELDS",
    "COUNTER_FIELDS",
    "parse_metrics",
    "engine_of",
    "metrics_url",
    "scrape",
    "snapshot",
    "delta",
    "counter_resets",
    "MetricsSampler",
    "load_samples",
]

log = logging.getLogger(__name__)

Engine = Literal["vllm", "sglang", "unknown"]


@dataclass
class ServerSample:
    """One scrape of a server's ``/metrics`` mapped to an engine-neutral schema.

    Every field except ``engine`` is None when the engine (or its version/flags)
    does not expose it. Fields ending in ``_total`` and histogram ``*_sum_s`` /
    ``*_count`` fields are cumulative since server start; the rest are point-in-time.
    """

    engine: str = "unknown"  # "vllm" | "sglang" | "unknown"
    # KV cache
    kv_usage_frac: float | None = None  # 0..1, mean over engines/ranks
    kv_capacity_tokens: int | None = None  # total KV slots in tokens over engines
    num_gpu_blocks: int | None = None  # vLLM, per engine (cache_config_info label)
    block_size: int | None = None  # vLLM, tokens per KV block
    # scheduler
    running: int | None = None  # requests in the running batch
    waiting: int | None = None  # requests queued
    preemptions_total: float | None = None  # vLLM preemptions / SGLang retractions (counter)
    retracted_reqs: int | None = None  # SGLang gauge: retractions in the last log interval
    # prefix cache (vLLM: tokens queried/hit; SGLang: cached prompt tokens)
    prefix_cache_queries_total: float | None = None
    prefix_cache_hits_total: float | None = None
    cache_hit_rate: float | None = None  # SGLang gauge, 0..1, last batch
    # speculative decoding
    spec_drafts_total: float | None = None  # vLLM
    spec_draft_tokens_total: float | None = None  # vLLM
    spec_accepted_tokens_total: float | None = None  # vLLM
    spec_accept_length: float | None = None  # SGLang gauge, tokens per verify step
    # throughput counters
    prompt_tokens_total: float | None = None
    generation_tokens_total: float | None = None
    # histogram sums (seconds) and counts (observations)
    ttft_sum_s: float | None = None
    ttft_count: float | None = None
    itl_sum_s: float | None = None
    itl_count: float | None = None
    prefill_sum_s: float | None = None
    prefill_count: float | None = None
    queue_sum_s: float | None = None
    queue_count: float | None = None
    e2e_sum_s: float | None = None
    e2e_count: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


SAMPLE_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(ServerSample))

# Cumulative fields that delta() differences.
COUNTER_FIELDS: tuple[str, ...] = (
    "prefix_cache_queries_total",
    "prefix_cache_hits_total",
    "preemptions_total",
    "prompt_tokens_total",
    "generation_tokens_total",
    "spec_drafts_total",
    "spec_draft_tokens_total",
    "spec_accepted_tokens_total",
    "ttft_sum_s",
    "ttft_count",
    "itl_sum_s",
    "itl_count",
    "prefill_sum_s",
    "prefill_count",
    "queue_sum_s",
    "queue_count",
    "e2e_sum_s",
    "e2e_count",
)

# --------------------------------------------------------------------------- parsing

_Series = list[tuple[dict[str, str], float]]


def _index(text: str) -> dict[str, _Series]:
    """Sample name -> [(labels, value)], across all families.

    Indexing by *sample* name sidesteps the parser's family renaming (a counter
    family ``x`` has samples ``x_total``/``x_created``; a histogram ``h`` has
    ``h_bucket``/``h_sum``/``h_count``). NaN values are dropped.
    """
    out: dict[str, _Series] = defaultdict(list)
    # Histogram buckets are most of the lines and nothing here reads them (only _sum/_count):
    # dropping them before the pure-Python parser cuts its CPU per scrape several-fold, CPU the
    # sampler would otherwise take from the client and, on a small machine, from the server.
    text = "\n".join(ln for ln in text.split("\n") if "_bucket{" not in ln)
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            v = float(s.value)
            if math.isnan(v):
                continue
            out[s.name].append((dict(s.labels), v))
    return out


def _first(idx: Mapping[str, _Series], names: Iterable[str]) -> _Series | None:
    """Series of the first name present (preference order, never summed across names)."""
    for n in names:
        series = idx.get(n)
        if series:
            return series
    return None


def _counter_names(base: str) -> tuple[str, str]:
    # Typed counters always parse to `<base>_total`; an untyped bare `<base>` line
    # (no TYPE comment) keeps its literal name.
    return (f"{base}_total", base)


def _dedup_tp(series: _Series) -> _Series:
    """Keep one series per label set ignoring ``tp_rank`` (SGLang TP mirrors)."""
    best: dict[tuple[tuple[str, str], ...], tuple[int, dict[str, str], float]] = {}
    for labels, v in series:
        key = tuple(sorted((k, val) for k, val in labels.items() if k != "tp_rank"))
        try:
            rank = int(labels.get("tp_rank", "0"))
        except ValueError:
            rank = 0
        if key not in best or rank < best[key][0]:
            best[key] = (rank, labels, v)
    return [(labels, v) for _, labels, v in best.values()]


def _sum(series: _Series | None) -> float | None:
    return None if not series else float(sum(v for _, v in series))


def _mean(series: _Series | None) -> float | None:
    return None if not series else float(sum(v for _, v in series) / len(series))


def _int(x: float | None) -> int | None:
    return None if x is None else int(round(x))


def _label_int(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(float(value))
    except ValueError:  # "None" before the KV cache is initialised
        return None


_ENGINE_LINE = re.compile(r"^(vllm|sglang):", re.MULTILINE)


def engine_of(text: str) -> Engine:
    """"vllm" or "sglang" from the metric-name prefixes of sample lines, else "unknown".

    Comment lines (``# HELP``/``# TYPE``) are ignored; if both prefixes occur, the
    one with more sample lines wins.
    """
    counts = {"vllm": 0, "sglang": 0}
    for m in _ENGINE_LINE.finditer(text):
        counts[m.group(1)] += 1
    if counts["vllm"] == 0 and counts["sglang"] == 0:
        return "unknown"
    return "vllm" if counts["vllm"] >= counts["sglang"] else "sglang"


def _hist(idx: Mapping[str, _Series], bases: Iterable[str], tp_dedup: bool = False) -> tuple[float | None, float | None]:
    """(sum, count) of the first histogram base name that is present."""
    for base in bases:
        s, c = idx.get(f"{base}_sum"), idx.get(f"{base}_count")
        if s or c:
            if tp_dedup:
                s = _dedup_tp(s) if s else s
                c = _dedup_tp(c) if c else c
            return _sum(s), _sum(c)
    return None, None


def _parse_vllm(idx: Mapping[str, _Series]) -> ServerSample:
    s = ServerSample(engine="vllm")
    s.kv_usage_frac = _mean(_first(idx, ["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"]))
    s.running = _int(_sum(_first(idx, ["vllm:num_requests_running"])))
    s.waiting = _int(_sum(_first(idx, ["vllm:num_requests_waiting"])))
    s.preemptions_total = _sum(_first(idx, _counter_names("vllm:num_preemptions")))
    s.prefix_cache_queries_total = _sum(
        _first(idx, [*_counter_names("vllm:prefix_cache_queries"), *_counter_names("vllm:gpu_prefix_cache_queries")])
    )
    s.prefix_cache_hits_total = _sum(
        _first(idx, [*_counter_names("vllm:prefix_cache_hits"), *_counter_names("vllm:gpu_prefix_cache_hits")])
    )
    s.spec_drafts_total = _sum(_first(idx, _counter_names("vllm:spec_decode_num_drafts")))
    s.spec_draft_tokens_total = _sum(_first(idx, _counter_names("vllm:spec_decode_num_draft_tokens")))
    s.spec_accepted_tokens_total = _sum(_first(idx, _counter_names("vllm:spec_decode_num_accepted_tokens")))
    s.prompt_tokens_total = _sum(_first(idx, _counter_names("vllm:prompt_tokens")))
    s.generation_tokens_total = _sum(_first(idx, _counter_names("vllm:generation_tokens")))

    info = _first(idx, ["vllm:cache_config_info"])
    if info:

        def engine_key(item: tuple[dict[str, str], float]) -> tuple[int, str]:
            e = item[0].get("engine", "")
            return (int(e), e) if e.isdigit() else (1 << 30, e)

        ordered = sorted(info, key=engine_key)
        s.num_gpu_blocks = _label_int(ordered[0][0].get("num_gpu_blocks"))
        s.block_size = _label_int(ordered[0][0].get("block_size"))
        caps = [
            (_label_int(lab.get("num_gpu_blocks")), _label_int(lab.get("block_size"))) for lab, _ in ordered
        ]
        if all(nb is not None and bs is not None for nb, bs in caps):
            s.kv_capacity_tokens = sum(nb * bs for nb, bs in caps)  # type: ignore[operator]

    s.ttft_sum_s, s.ttft_count = _hist(idx, ["vllm:time_to_first_token_seconds"])
    s.itl_sum_s, s.itl_count = _hist(idx, ["vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"])
    s.prefill_sum_s, s.prefill_count = _hist(idx, ["vllm:request_prefill_time_seconds"])
    s.queue_sum_s, s.queue_count = _hist(idx, ["vllm:request_queue_time_seconds"])
    s.e2e_sum_s, s.e2e_count = _hist(idx, ["vllm:e2e_request_latency_seconds"])
    return s


def _parse_sglang(idx: Mapping[str, _Series]) -> ServerSample:
    def get(names: Iterable[str]) -> _Series | None:
        series = _first(idx, names)
        return _dedup_tp(series) if series else None

    s = ServerSample(engine="sglang")
    s.kv_usage_frac = _mean(get(["sglang:token_usage"]))
    s.kv_capacity_tokens = _int(_sum(get(["sglang:max_total_num_tokens"])))
    s.running = _int(_sum(get(["sglang:num_running_reqs"])))
    s.waiting = _int(_sum(get(["sglang:num_queue_reqs"])))
    s.preemptions_total = _sum(get(_counter_names("sglang:num_retracted_requests")))
    s.retracted_reqs = _int(_sum(get(["sglang:num_retracted_reqs"])))
    s.prefix_cache_hits_total = _sum(get(_counter_names("sglang:cached_tokens")))
    s.cache_hit_rate = _mean(get(["sglang:cache_hit_rate"]))
    s.spec_accept_length = _mean(get(["sglang:spec_accept_length"]))
    s.prompt_tokens_total = _sum(get(_counter_names("sglang:prompt_tokens")))
    s.generation_tokens_total = _sum(get(_counter_names("sglang:generation_tokens")))
    s.ttft_sum_s, s.ttft_count = _hist(idx, ["sglang:time_to_first_token_seconds"], tp_dedup=True)
    s.itl_sum_s, s.itl_count = _hist(idx, ["sglang:inter_token_latency_seconds"], tp_dedup=True)
    s.e2e_sum_s, s.e2e_count = _hist(idx, ["sglang:e2e_request_latency_seconds"], tp_dedup=True)
    return s


def parse_metrics(text: str) -> ServerSample:
    """Parse Prometheus exposition text into a :class:`ServerSample`.

    Raises ValueError (from prometheus_client) when the text is not valid
    exposition format; unknown engines give ``ServerSample(engine="unknown")``.
    """
    engine = engine_of(text)
    if engine == "unknown":
        list(text_string_to_metric_families(text))  # still validate the format
        return ServerSample()
    idx = _index(text)
    return _parse_vllm(idx) if engine == "vllm" else _parse_sglang(idx)


# --------------------------------------------------------------------------- scraping


def metrics_url(base_url: str) -> str:
    """``<server root>/metrics`` from a server root, an OpenAI ``.../v1`` base URL,
    or a URL that already ends in ``/metrics``."""
    u = base_url.rstrip("/")
    if u.endswith("/metrics"):
        return u
    if u.endswith("/v1"):
        u = u[: -len("/v1")]
    return f"{u}/metrics"


async def scrape(
    client: httpx.AsyncClient, base_url: str, headers: Mapping[str, str] | None = None
) -> ServerSample | None:
    """GET ``/metrics`` once. None when the server answers 404 (no metrics endpoint,
    e.g. SGLang without ``--enable-metrics``); other HTTP errors and transport errors
    raise (httpx.HTTPStatusError / httpx.TransportError), bad text raises ValueError."""
    resp = await client.get(metrics_url(base_url), headers=dict(headers) if headers else None)
    if resp.status_code == 404:
        return None
    resp.raise_for_status()
    return parse_metrics(resp.text)


async def snapshot(
    base_url: str, headers: Mapping[str, str] | None = None, timeout_s: float = 5.0
) -> ServerSample | None:
    """One-off :func:`scrape` with a throwaway client (e.g. before/after a run)."""
    async with httpx.AsyncClient(timeout=timeout_s) as client:
        return await scrape(client, base_url, headers)


# --------------------------------------------------------------------------- deltas


def _field(x: ServerSample | Mapping[str, Any], name: str) -> float | None:
    v = getattr(x, name, None) if isinstance(x, ServerSample) else x.get(name)
    if v is None:
        return None
    v = float(v)
    return None if math.isnan(v) else v


def delta(
    before: ServerSample | Mapping[str, Any], after: ServerSample | Mapping[str, Any]
) -> dict[str, float | None]:
    """``after - before`` for every cumulative field in :data:`COUNTER_FIELDS`.

    Accepts ServerSamples or mappings (e.g. rows of :func:`load_samples`). A field is
    None when either side lacks it. If a counter went down (server restarted) the
    Prometheus ``increase()`` convention is used: the delta is ``after``; see
    :func:`counter_resets` to detect that.
    """
    out: dict[str, float | None] = {}
    for name in COUNTER_FIELDS:
        b, a = _field(before, name), _field(after, name)
        if a is None or b is None:
            out[name] = None
        else:
            out[name] = a if a < b else a - b
    return out


def counter_resets(
    before: ServerSample | Mapping[str, Any], after: ServerSample | Mapping[str, Any]
) -> list[str]:
    """Names of cumulative fields that decreased between the two samples."""
    resets = []
    for name in COUNTER_FIELDS:
        b, a = _field(before, name), _field(after, name)
        if a is not None and b is not None and a < b:
            resets.append(name)
    return resets


# --------------------------------------------------------------------------- sampler


def _now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


class MetricsSampler:
    """Background scraper writing one JSON line per sample to ``path``.

    ::

        async with MetricsSampler(base_url, run_dir / "server_metrics.jsonl", interval_s=0.5) as s:
            s.set_level("c=4 in=512")
            ...

    Each line: ``{"t_s", "wall_time", "level", **ServerSample fields, "scrape_latency_s"}``
    where ``t_s`` is ``time.perf_counter()`` seconds since the sampler started, taken
    when the request was sent, and ``level`` is the label set at that moment. Lines are
    appended (the file is never truncated) and flushed one by one.

    The first scrape happens inside ``__aenter__``/:meth:`start`. If it finds no
    metrics (HTTP 404 or connection refused) one line
    ``{"available": false, "reason": ..., "url": ..., "t_s": ..., "wall_time": ..., "level": ...}``
    is written, :attr:`available` becomes False and nothing else is sampled. Later
    failures (timeouts, 5xx, bad text, a 404 after metrics were seen) are counted in
    :attr:`n_errors` (:attr:`last_error` keeps the latest) and never raised. On exit one
    final sample is taken. A failure to *write* the file is re-raised on exit.
    """

    def __init__(
        self,
        base_url: str,
        path: str | os.PathLike[str],
        interval_s: float = 0.5,
        headers: Mapping[str, str] | None = None,
        *,
        timeout_s: float = 5.0,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be > 0")
        self.base_url = base_url
        self.url = metrics_url(base_url)
        self.path = Path(path)
        self.interval_s = float(interval_s)
        self.headers = dict(headers) if headers else None
        self.timeout_s = timeout_s
        self._client = client
        self._own_client = client is None
        self._level: str | None = None
        self._t0 = 0.0
        self._fh: IO[str] | None = None
        self._task: asyncio.Task[None] | None = None
        self._stop_evt = asyncio.Event()
        self._task_error: BaseException | None = None
        self._started = False
        self._stopped = False
        self.available: bool | None = None  # None until a scrape succeeds or the first one says "no metrics"
        self.unavailable_reason: str | None = None
        self.n_samples = 0
        self.n_errors = 0
        self.last_error: str | None = None

    # -- public API
    @property
    def level(self) -> str | None:
        return self._level

    def set_level(self, label: str | None) -> None:
        """Label attached to every following sample (e.g. ``"c=4 in=512"``)."""
        self._level = label

    async def start(self) -> None:
        if self._started:
            raise RuntimeError("MetricsSampler already started")
        self._started = True
        self._stop_evt = asyncio.Event()  # bound to the running loop
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.path, "a", encoding="utf-8")
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.timeout_s)
        self._t0 = time.perf_counter()

        t_send = time.perf_counter()
        level = self._level
        try:
            sample = await scrape(self._client, self.base_url, self.headers)
        except httpx.ConnectError as e:
            self._mark_unavailable(f"connection failed: {e!r}", t_send, level)
            return
        except Exception as e:  # transient: keep sampling
            self._count_error(e)
        else:
            if sample is None:
                self._mark_unavailable(f"GET {self.url} -> HTTP 404 (no metrics endpoint)", t_send, level)
                return
            self._write_sample(sample, t_send, level)
        self._task = asyncio.create_task(self._run(), name=f"MetricsSampler({self.url})")

    async def stop(self) -> None:
        """Cancel the loop, take one final sample (unless unavailable), close the file."""
        if not self._started or self._stopped:
            return
        self._stopped = True
        try:
            if self._task is not None:
                # Let an in-flight scrape finish (bounded by the HTTP timeout) rather
                # than cancelling it mid-request and losing that sample.
                self._stop_evt.set()
                try:
                    await asyncio.wait_for(asyncio.shield(self._task), timeout=self.timeout_s + 1.0)
                except asyncio.TimeoutError:
                    self._task.cancel()
                    try:
                        await self._task
                    except asyncio.CancelledError:
                        pass
                    except Exception as e:  # noqa: BLE001
                        self._task_error = e
                except Exception as e:  # noqa: BLE001 - write failure inside the loop
                    self._task_error = e
            if self.available is not False and self._task_error is None:
                try:
                    await self._sample_once()
                except Exception as e:  # noqa: BLE001
                    self._task_error = e
        finally:
            if self._fh is not None:
                self._fh.close()
                self._fh = None
            if self._own_client and self._client is not None:
                await self._client.aclose()
                self._client = None

    async def __aenter__(self) -> MetricsSampler:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()
        if self._task_error is not None:
            if exc_type is None:
                raise self._task_error
            log.warning("MetricsSampler write failure (%r) while the run itself failed", self._task_error)

    # -- internals
    async def _run(self) -> None:
        while not self._stop_evt.is_set():
            elapsed = time.perf_counter() - self._t0
            next_tick = self._t0 + (math.floor(elapsed / self.interval_s) + 1) * self.interval_s
            try:
                await asyncio.wait_for(self._stop_evt.wait(), timeout=max(0.0, next_tick - time.perf_counter()))
                return  # stop requested while waiting for the next tick
            except asyncio.TimeoutError:
                pass
            await self._sample_once()

    async def _sample_once(self) -> bool:
        assert self._client is not None
        t_send = time.perf_counter()
        level = self._level
        try:
            sample = await scrape(self._client, self.base_url, self.headers)
        except Exception as e:  # noqa: BLE001 - transient scrape failures are counted
            self._count_error(e)
            return False
        if sample is None:
            self._count_error(f"GET {self.url} -> HTTP 404")
            return False
        self._write_sample(sample, t_send, level)
        return True

    def _count_error(self, err: BaseException | str) -> None:
        self.n_errors += 1
        self.last_error = err if isinstance(err, str) else repr(err)
        log.debug("metrics scrape failed: %s", self.last_error)

    def _write(self, rec: Mapping[str, Any]) -> None:
        assert self._fh is not None
        self._fh.write(json.dumps(rec, allow_nan=False) + "\n")
        self._fh.flush()

    def _write_sample(self, sample: ServerSample, t_send: float, level: str | None) -> None:
        rec: dict[str, Any] = {"t_s": round(t_send - self._t0, 6), "wall_time": _now_iso(), "level": level}
        rec.update(sample.to_dict())
        rec["scrape_latency_s"] = round(time.perf_counter() - t_send, 6)
        self._write(rec)
        self.available = True
        self.n_samples += 1

    def _mark_unavailable(self, reason: str, t_send: float, level: str | None) -> None:
        self.available = False
        self.unavailable_reason = reason
        self._write(
            {
                "available": False,
                "reason": reason,
                "url": self.url,
                "t_s": round(t_send - self._t0, 6),
                "wall_time": _now_iso(),
                "level": level,
            }
        )


# --------------------------------------------------------------------------- reading


_NUMERIC_FIELDS = [f for f in SAMPLE_FIELDS if f != "engine"] + ["t_s", "scrape_latency_s"]


def load_samples(path: str | os.PathLike[str]) -> pd.DataFrame:
    """Read a sampler JSONL file into a DataFrame (one row per sample).

    ``{"available": false}`` lines are dropped; ``df.attrs["available"]`` is False
    (and ``df.attrs["reason"]`` set) when the file holds only such lines. A
    truncated/corrupt line (e.g. the last one after a crash) is skipped.
    ``wall_time`` becomes a UTC datetime column; missing metrics are NaN.
    """
    rows: list[dict[str, Any]] = []
    unavailable: dict[str, Any] | None = None
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                log.warning("skipping unreadable line in %s", path)
                continue
            if rec.get("available") is False:
                unavailable = rec
                continue
            rows.append(rec)
    base_cols = ["t_s", "wall_time", "level", *SAMPLE_FIELDS, "scrape_latency_s"]
    df = pd.DataFrame(rows)
    for c in base_cols:
        if c not in df.columns:
            df[c] = pd.Series(dtype="object")
    df = df[base_cols + [c for c in df.columns if c not in base_cols]]
    for c in _NUMERIC_FIELDS:
        df[c] = pd.to_numeric(df[c], errors="coerce").astype("float64")
    df["wall_time"] = pd.to_datetime(df["wall_time"], utc=True, format="ISO8601")
    df.attrs["available"] = not (unavailable is not None and not rows)
    if unavailable is not None:
        df.attrs["reason"] = unavailable.get("reason")
    return df
