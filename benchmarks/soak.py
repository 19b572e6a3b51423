"""Soak: servelab's streaming client held at N concurrent streams against the reference server
(its own process, `selfcheck.RefProcess`) for a long time, to see whether the client leaks
memory or slows down.

Every `--sample-s` seconds it records the client process's RSS (psutil), the event loop's lag
over the window (how late a 5 ms sleep wakes up: `workers.LoopMonitor`'s measure), the
requests finished (ok, and failed by class), the streams in flight and the load average.
At the end: RSS growth from the first sample after warm-up to the last (MiB, and the slope of
a least-squares line in MiB per minute), lag per window, and the accounting: requests the
server saw (`/metrics` `generation_tokens_total` / tokens per request) against records.
Records are counted, not kept: the client's memory is the client's, not a growing list.

    .venv/bin/python benchmarks/soak.py --duration-s 600 --streams 256 \\
        [--out benchmarks/results/soak-<timestamp>.json]
    .venv/bin/python benchmarks/soak.py --smoke DIR    # 2 streams for 1.5 s, DIR/soak.json

`--smoke DIR` (make test runs it) leaves nothing out but length: 2 streams of 4 tokens for 1.5 s,
sampled every 0.5 s, so the RSS slope is taken over every sample (none is after the warm-up).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))

import httpx
import numpy as np
import psutil
from servelab.measure import client
from servelab.measure.selfcheck import RefProcess
from servelab.measure.rounds import LAG_TICK_S, run_sync

WARMUP_S = 60.0  # RSS growth is measured from the first sample after this


def _free_port() -> int:
    import socket

    for _ in range(50):
        p = random.randint(20000, 60000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", p))
                return p
            except OSError:
                continue
    raise RuntimeError("no free port in 20000-60000")


def _generated_tokens(url: str) -> int:
    for line in httpx.get(url + "/metrics", timeout=5).text.splitlines():
        if line.startswith("vllm:generation_tokens_total"):
            return int(float(line.split()[-1]))
    raise RuntimeError("no vllm:generation_tokens_total in /metrics")


async def soak(url: str, *, streams: int, duration_s: float, sample_s: float, tokens: int,
               log: Any = print) -> dict[str, Any]:
    proc = psutil.Process()
    kinds: Counter[str] = Counter()
    state = {"ok": 0, "in_flight": 0}
    lags: list[float] = []
    samples: list[dict[str, Any]] = []
    stop_at = time.perf_counter() + duration_s
    spec = client.RequestSpec(prompt="soak the client", max_tokens=tokens, model="ref", api="chat", seed=None)

    async def stream(http: client.StreamClient) -> None:
        while time.perf_counter() < stop_at:
            state["in_flight"] += 1
            r = await client.send(http, spec, timeout_s=60)
            state["in_flight"] -= 1
            if r.ok and r.output_tokens == tokens:
                state["ok"] += 1
            else:
                kinds[r.error_kind or "wrong_tokens"] += 1

    async def lag_probe() -> None:
        while True:
            t = time.perf_counter()
            await asyncio.sleep(LAG_TICK_S)
            lags.append(max(0.0, time.perf_counter() - t - LAG_TICK_S))

    async def sampler(t0: float, cpu0: float) -> None:
        last_ok = 0
        while True:
            await asyncio.sleep(sample_s)
            win = np.array(lags) if lags else np.array([0.0])
            lags.clear()
            rss = proc.memory_info().rss
            s = {"t_s": round(time.perf_counter() - t0, 1), "rss_mib": round(rss / 2**20, 2),
                 "lag_p50_ms": round(float(np.percentile(win, 50)) * 1e3, 3),
                 "lag_p99_ms": round(float(np.percentile(win, 99)) * 1e3, 3),
                 "lag_max_ms": round(float(win.max()) * 1e3, 3), "ok": state["ok"],
                 "ok_per_s": round((state["ok"] - last_ok) / sample_s, 1), "failed": sum(kinds.values()),
                 "in_flight": state["in_flight"], "cpu_frac": round((time.process_time() - cpu0) / (time.perf_counter() - t0), 3),
                 "load_1m": round(os.getloadavg()[0], 2)}
            last_ok = state["ok"]
            samples.append(s)
            log(json.dumps(s))

    async with client.StreamClient(url, concurrency=streams) as http:
        t0, cpu0 = time.perf_counter(), time.process_time()
        aux = [asyncio.create_task(lag_probe()), asyncio.create_task(sampler(t0, cpu0))]
        await asyncio.gather(*(stream(http) for _ in range(streams)))
        for t in aux:
            t.cancel()
        wall_s = time.perf_counter() - t0
    return {"samples": samples, "ok": state["ok"], "failed_by_kind": dict(kinds), "wall_s": wall_s}


def rss_growth(samples: list[dict[str, Any]], warmup_s: float = WARMUP_S) -> dict[str, float]:
    """RSS after warm-up: first, last, growth (MiB) and the least-squares slope (MiB/min)."""
    after = [s for s in samples if s["t_s"] >= warmup_s] or samples
    t = np.array([s["t_s"] for s in after])
    m = np.array([s["rss_mib"] for s in after])
    slope = float(np.polyfit(t / 60.0, m, 1)[0]) if len(after) >= 2 else 0.0
    return {"rss_first_mib": float(m[0]), "rss_last_mib": float(m[-1]), "rss_growth_mib": float(m[-1] - m[0]),
            "rss_slope_mib_per_min": slope, "rss_max_mib": float(max(s["rss_mib"] for s in samples))}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration-s", type=float, default=600.0)
    ap.add_argument("--streams", type=int, default=256)
    ap.add_argument("--sample-s", type=float, default=10.0)
    ap.add_argument("--ttft-s", type=float, default=0.05)
    ap.add_argument("--itl-s", type=float, default=0.05)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--smoke", type=Path, metavar="DIR", help="2 streams for 1.5 s; writes DIR/soak.json")
    a = ap.parse_args(argv)
    if a.smoke:
        vars(a).update(duration_s=1.5, streams=2, sample_s=0.5, ttft_s=0.005, itl_s=0.005, tokens=4,
                       out=a.smoke / "soak.json")
    out = a.out or ROOT / "benchmarks" / "results" / f"soak-{time.strftime('%Y%m%d-%H%M%S')}.json"
    with RefProcess(ttft_s=a.ttft_s, itl_s=a.itl_s, port=_free_port(), uvloop=True) as ref:
        load0 = os.getloadavg()
        res = run_sync(soak(ref.url, streams=a.streams, duration_s=a.duration_s, sample_s=a.sample_s, tokens=a.tokens))
        seen = _generated_tokens(ref.url)
        server_cpu_s = ref.cpu_s()
    lag99 = [s["lag_p99_ms"] for s in res["samples"]]
    summary = {
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in (vars(a) | {"out": out}).items()},
        "load_avg_start": load0, "load_avg_end": os.getloadavg(),
        "cpus": os.cpu_count(), "wall_s": res["wall_s"], "ok": res["ok"], "failed_by_kind": res["failed_by_kind"],
        "records": res["ok"] + sum(res["failed_by_kind"].values()),
        "server_tokens_generated": seen, "server_requests_completed": seen / a.tokens,
        "server_cpu_s": server_cpu_s, **rss_growth(res["samples"]),
        "lag_p99_ms_first_min": float(np.median(lag99[: max(1, int(60 / a.sample_s))])),
        "lag_p99_ms_last_min": float(np.median(lag99[-max(1, int(60 / a.sample_s)):])),
        "samples": res["samples"],
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "samples"}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
