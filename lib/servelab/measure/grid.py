"""The grid of one configuration: its levels (bucket x concurrency or rate; a trace bucket is
one level at its own arrivals), how many items a round holds, open-loop send times, the
calibrated workload source of each bucket, and the server's prefix-cache counters read around
a level. Not for sending (`runner`, `workers`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import httpx

from ..hosts.base import Server
from ..schema import Bucket, Workload
from . import arrivals
from .metrics import snapshot
from .sources import make_source
from .sources.trace import load as load_trace, mean_rate_rps
from .rounds import run_sync
from .workload import TokenCounter, token_counter


@dataclass
class Level:
    bucket: Bucket
    concurrency: int  # closed loop: in-flight requests; open loop: the cap
    rate_rps: float = 0.0  # 0 = closed loop

    @property
    def label(self) -> str:
        load = f"rate={self.rate_rps:g}/s" if self.rate_rps else f"c={self.concurrency}"
        return f"{self.bucket.label} {load}"



def levels(wl: Workload) -> list[Level]:
    """The grid: bucket x concurrency (closed loop) or bucket x rate (open loop); a trace
    bucket is one level at its own arrivals (capped at max_in_flight)."""
    out = []
    for b in wl.buckets:
        if b.trace is not None:
            out.append(Level(b, wl.max_in_flight, mean_rate_rps(load_trace(b.trace))))
        elif wl.arrival == "concurrency":
            out.extend(Level(b, c) for c in wl.concurrency)
        else:
            out.extend(Level(b, wl.max_in_flight, r) for r in wl.rates_rps)
    return out


def requests_per_round(wl: Workload, lv: Level) -> int:
    """Items of one round: requests, or sessions for a session bucket (each of `turns` requests)."""
    if lv.bucket.trace is not None:
        return len(load_trace(lv.bucket.trace))
    if lv.rate_rps:
        return max(1, round(lv.rate_rps * wl.duration_s))
    ramp = lv.concurrency if wl.concurrency_ramp_s else 0  # each worker's first request fills the loop (warm-up)
    return lv.concurrency * wl.requests_per_round + ramp


def arrival_offsets(wl: Workload, lv: Level, n: int, seed: int) -> list[float]:
    """Scheduled send times (s from round start) for open-loop arrivals (`arrivals.offsets`)."""
    ramp = (wl.ramp_up.strategy, wl.ramp_up.start_rps, wl.ramp_up.end_rps) if wl.ramp_up else None
    return arrivals.offsets(wl.arrival, lv.rate_rps, n, seed, burstiness=wl.burstiness, ramp=ramp)


def make_sources(server: Server, wl: Workload, warn: Callable[[str], None] = print,
                 counter: TokenCounter | None = None) -> dict[str, Any]:
    """One calibrated workload source per bucket label (`sources.make_source`); `counter` counts
    tokens on this server (made here when not given)."""
    counter = counter or token_counter(server.base_url, server.model, wl.api, server.headers, server.tokenizer_dir,
                                       wl.chat_template_kwargs, warn=warn)
    block = None
    if any(b.prefix_reuse is not None for b in wl.buckets):
        try:
            sample = run_sync(snapshot(server.base_url, server.headers))
        except (httpx.HTTPError, ValueError):
            sample = None
        block = getattr(sample, "block_size", None)
        if not block:
            warn("the server reports no KV block size on /metrics: prefix_reuse counted in single tokens")
    return {b.label: make_source(b, wl, counter, block) for b in wl.buckets}


async def cache_counters(server: Server) -> tuple[float, float] | None:
    """(prefix-cache tokens queried, tokens hit) from the server's counters, None without them."""
    try:
        s = await snapshot(server.base_url, server.headers)
    except (httpx.HTTPError, ValueError):  # no counters is no check, never a failed run
        return None
    q, h = (getattr(s, "prefix_cache_queries_total", None), getattr(s, "prefix_cache_hits_total", None))
    return (float(q), float(h)) if q is not None and h is not None else None


def planned_requests(wl: Workload) -> int:
    """Requests one configuration sends (warmup included): sessions count their turns, a
    trace bucket its replayed rows per round."""
    n = 0
    for lv in levels(wl):
        turns = lv.bucket.session.turns if lv.bucket.session else 1
        n += (wl.warmup_rounds + wl.rounds) * requests_per_round(wl, lv) * turns
    return n
