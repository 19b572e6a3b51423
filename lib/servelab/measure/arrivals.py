"""Open-loop send times: constant, Poisson, Gamma burstiness and ramp-up (vLLM bench's
definitions), seeded so a level's schedule is the same on every run. Not for sending.

Gamma (`vllm/benchmarks/serve.py` get_request): inter-arrival gaps ~ Gamma(shape=burstiness,
scale=1 / (rate x burstiness)), so the mean gap stays 1 / rate at any burstiness; burstiness 1 is
Poisson. Without a ramp-up the offsets are rescaled so the last one lands at n / rate, as vLLM
does ("the sum would have a 1-2 % gap ... to stabilize throughput across seeds"). Ramp-up: the
rate of request i moves from start to end linearly (start + (end - start) x i / (n - 1)) or
exponentially (start x (end / start) ^ (i / (n - 1))).
"""

from __future__ import annotations

import random

import numpy as np


def ramp_rate(strategy: str, start_rps: float, end_rps: float, i: int, n: int) -> float:
    """The rate (requests/s) at request i of n under a ramp-up."""
    p = i / (n - 1) if n > 1 else 1.0
    if strategy == "exponential":
        return start_rps * (end_rps / start_rps) ** p
    return start_rps + (end_rps - start_rps) * p


def offsets(kind: str, rate_rps: float, n: int, seed: int, *, burstiness: float = 1.0,
            ramp: tuple[str, float, float] | None = None) -> list[float]:
    """n send times in seconds from the round start (the first at 0).

    kind: "constant", "poisson" or "gamma"; `ramp` = (strategy, start_rps, end_rps) replaces the
    fixed rate. Raises ValueError for a non-positive rate or burstiness."""
    if n <= 0:
        return []
    if rate_rps <= 0 and ramp is None:
        raise ValueError(f"open-loop arrivals need a positive rate, got {rate_rps}")
    if burstiness <= 0:
        raise ValueError(f"burstiness must be positive, got {burstiness}")
    if ramp is None and kind == "constant":
        return [i / rate_rps for i in range(n)]
    if ramp is None and kind == "poisson":  # servelab's schedule since open loop existed: kept identical
        rng0 = random.Random(seed)
        t0, out = 0.0, []
        for _ in range(n):
            out.append(t0)
            t0 += rng0.expovariate(rate_rps)
        return out
    rates = np.array([ramp_rate(ramp[0], ramp[1], ramp[2], i, n) for i in range(n)] if ramp else [rate_rps] * n)
    if kind == "constant":
        gaps = 1.0 / rates
    else:
        shape = 1.0 if kind == "poisson" else burstiness
        rng = np.random.default_rng(seed)
        gaps = rng.gamma(shape, 1.0 / (rates * shape))
    # gap i separates request i from i + 1: the first request goes at 0
    t = np.concatenate([[0.0], np.cumsum(gaps[:-1])])
    if kind == "gamma" and ramp is None and n > 1 and t[-1] > 0:
        t *= ((n - 1) / rate_rps) / t[-1]
    return [float(x) for x in t]


def burstiness_of(times_s: list[float] | np.ndarray) -> float | None:
    """The gamma shape that fits inter-arrival gaps by moments (mean^2 / variance): 1 for a
    Poisson process, < 1 for bursty traffic. None with fewer than three arrivals or no spread."""
    t = np.sort(np.asarray(times_s, dtype=float))
    gaps = np.diff(t)
    if len(gaps) < 2 or gaps.var() <= 0:
        return None
    return float(gaps.mean() ** 2 / gaps.var())
