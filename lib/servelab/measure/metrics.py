"""Sample an engine's Prometheus `/metrics` during a run into `server_metrics.jsonl`.

`MetricsSampler` scrapes in the background, tags each sample with the load level running at
that moment and appends it (scrubbed, flushed) to the run folder; the engine profile maps
the metric names (`engines`). `delta` and `counter_resets` do counter arithmetic between two
samples, e.g. to assert that the prefix cache served no hits during a cache-free run. Not a
Prometheus server: histograms are kept only as `_sum`/`_count` pairs.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import httpx

from ..engines import parse_metrics
from ..engines.prom import COUNTER_FIELDS, LIST_FIELDS, ServerSample
from ..runfolder import now_iso

log = logging.getLogger(__name__)


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
    out: dict[str, Any] = {}
    for name in COUNTER_FIELDS:
        b, a = _field(before, name), _field(after, name)
        if a is None or b is None:
            out[name] = None
        else:
            out[name] = a if a < b else a - b
    for name in LIST_FIELDS:  # per-position counters: element-wise, positions missing before count from 0
        b_l, a_l = _list_field(before, name), _list_field(after, name)
        if a_l is None:
            out[name] = None
        else:
            b_l = (b_l or []) + [0.0] * max(0, len(a_l) - len(b_l or []))
            out[name] = [a if a < b else a - b for a, b in zip(a_l, b_l)]
    return out


def _list_field(x: ServerSample | Mapping[str, Any], name: str) -> list[float] | None:
    v = getattr(x, name, None) if isinstance(x, ServerSample) else x.get(name)
    return [float(e) for e in v] if isinstance(v, (list, tuple)) else None


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
        self.paused = False
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

    def pause(self, paused: bool = True) -> None:
        """Skip the periodic scrapes while paused (an idle engine of an interleaved run: its
        /metrics would cost the measured engine CPU and say nothing)."""
        self.paused = paused

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
            if not self.paused:
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
        rec: dict[str, Any] = {"t_s": round(t_send - self._t0, 6), "wall_time": now_iso("milliseconds"), "level": level}
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
                "wall_time": now_iso("milliseconds"),
                "level": level,
            }
        )
