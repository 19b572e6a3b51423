"""Scale-out of servelab's client: local processes against Ray actors (measure.ray_pool).

Two parts, against the reference server in its own process (`selfcheck.RefProcess`):

1. Streams sustained: `selfcheck.calibrate` at LEVELS streams (100 ms TTFT, 20 ms gaps, 64
   tokens: the self-check defaults) for local 1 process, local 2 processes, Ray 1 worker and
   Ray 2 workers; per configuration the highest stream count with ITL median error <= 2 % at
   every level up to it (and the same for the full "ok" verdict, which also needs TTFT error
   <= 1 ms and nothing lost).
2. Ray's overhead per request at OVERHEAD_STREAMS streams x OVERHEAD_RPS requests each: client
   CPU per request (the workers' process CPU + this driver's, as the process CPU clock counts
   it, Ray's own threads included), the time a result takes to reach the driver after its
   request ended (`result_lag_*`: does not enter any measured time, which the worker takes),
   and the timing error next to the local client's at the same load.
3. The driver's own cost per record (JSON line written) and a result's size on the wire: with
   the receive cost from 2, what bounds the records per second one driver can take.
4. The driver's receive cost at a high result rate (RATE_REQUESTS short requests through 2
   Ray workers): a poll's fixed cost is shared by more results per batch.

On a one-machine Ray the workers share the driver's CLOCK_MONOTONIC, so the measured clock
offsets (`offset_s`, within +- rtt_s / 2 of 0) show the NTP-style estimate's own error.

    .venv/bin/python benchmarks/ray_scaleout.py [--out benchmarks/results/ray-scaleout.json]
    .venv/bin/python benchmarks/ray_scaleout.py --smoke DIR    # every part, tiny: DIR/ray-scaleout.json

`--smoke DIR` (make test runs it) leaves out Ray with one worker (the lines of two workers, with one)
and size: one pass of local 1 and 2 processes and Ray 2 workers at 2 and 4 streams of 4 tokens (10 ms
TTFT, 5 ms gaps), the overhead at 4 streams x 1 request, the rate part with 16 requests, on a local Ray
started for it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))

from servelab.hosts.base import Server
from servelab.measure import client
from servelab.measure.selfcheck import (
    ITL_ERR_LIMIT_PCT,
    RefProcess,
    calibrate,
    level_errors,
    machine_facts,
)
from servelab.measure.rounds import Job, run_loop, run_round, run_sync
from servelab.measure.workers import WorkerPool

LEVELS = (64, 128, 256, 512, 768, 1024)
TTFT_S, ITL_S, TOKENS = 0.1, 0.02, 64
OVERHEAD_STREAMS, OVERHEAD_RPS = 128, 4
RATE_REQUESTS, RATE_STREAMS, RATE_TOKENS = 4000, 128, 4
CONFIGS = [("local-1", "local", 1), ("local-2", "local", 2), ("ray-1", "ray", 1), ("ray-2", "ray", 2)]
# --smoke: these constants, smallest; ray-1 left out (ray-2's lines with one worker fewer)
SMOKE_SIZES = {"LEVELS": (2, 4), "TTFT_S": 0.01, "ITL_S": 0.005, "TOKENS": 4, "OVERHEAD_STREAMS": 4, "OVERHEAD_RPS": 1,
               "RATE_REQUESTS": 16, "RATE_STREAMS": 4, "CONFIGS": [c for c in CONFIGS if c[0] != "ray-1"]}


def sustained(levels: list[dict[str, Any]], ok: Any) -> int | None:
    """The highest stream count such that `ok(level)` holds at it and at every level below."""
    best = None
    for lv in sorted(levels, key=lambda r: r["streams"]):
        if not ok(lv):
            break
        best = lv["streams"]
    return best


def scale(name: str, backend: str, n: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    df = calibrate(levels=LEVELS, ttft_s=TTFT_S, itl_s=ITL_S, tokens=TOKENS, workers=n, backend=backend, quiet=True)
    rows = json.loads(df.to_json(orient="records"))
    keep = ["streams", "requests", "ok", "ttft_err_p50_ms", "ttft_err_p95_ms", "itl_err_p50_pct", "lost_chunks",
            "server_late_p50_ms", "server_cpu_frac", "client_cpu_frac", "loop_lag_p99_ms", "load_avg_1m", "verdict"]
    out = {"config": name, "backend": backend, "workers": n, "wall_s": time.perf_counter() - t0,
           "max_streams_itl_ok": sustained(rows, lambda r: (r["itl_err_p50_pct"] or 1e9) <= ITL_ERR_LIMIT_PCT
                                           and not r["lost_chunks"]),
           "max_streams_verdict_ok": sustained(rows, lambda r: r["verdict"] == "ok"),
           "levels": [{k: r[k] for k in keep} for r in rows]}
    print(f"{name}: ITL<=2% up to {out['max_streams_itl_ok']} streams, verdict ok up to "
          f"{out['max_streams_verdict_ok']} ({out['wall_s']:.0f} s); ITL err % by level: "
          + ", ".join(f"{r['streams']}: {r['itl_err_p50_pct']:.2f}" for r in rows), flush=True)
    return out


def _specs(n: int) -> list[Job]:
    return [Job(i, client.RequestSpec(prompt="overhead", max_tokens=TOKENS, model="ref", seed=None)) for i in range(n)]


def overhead(name: str, backend: str, n: int, url: str) -> dict[str, Any]:
    """One warm round, then one measured round of OVERHEAD_STREAMS x OVERHEAD_RPS requests."""
    c, total = OVERHEAD_STREAMS, OVERHEAD_STREAMS * OVERHEAD_RPS
    results: list[Any] = []
    srv = Server(base_url=url, model="ref")
    pool: Any = None
    if backend == "ray":
        from servelab.measure.ray_pool import RayWorkerPool

        pool = RayWorkerPool(n, srv, c)
    elif n > 1:
        pool = WorkerPool(n, srv, c)
    try:
        if pool is None:
            async def local() -> dict[str, Any]:
                async with client.StreamClient(url, concurrency=c) as http:
                    await run_round(http, _specs(c), c, 60, lambda *a: None, asyncio.Event())
                    cpu0, t0 = time.process_time(), time.perf_counter()
                    st = await run_round(http, _specs(total), c, 60, lambda j, r, lag: results.append(r),
                                         asyncio.Event())
                    return {**st, "driver_cpu_s": time.process_time() - cpu0, "round_wall_s": time.perf_counter() - t0,
                            "worker_cpu_s": 0.0}  # the driver is the client
            st = run_loop(local())
        else:
            run_sync(pool.run_round(_specs(c), c, 60, lambda *a: None))
            cpu0, t0 = time.process_time(), time.perf_counter()
            st = run_sync(pool.run_round(_specs(total), c, 60, lambda j, r, lag: results.append(r)))
            st = {**st, "driver_cpu_s": time.process_time() - cpu0, "round_wall_s": time.perf_counter() - t0,
                  "worker_cpu_s": st["cpu_s"]}
    finally:
        if pool is not None:
            pool.close()
    clocks = pool.describe() if backend == "ray" else []  # after close: with the offsets at the end
    err = level_errors(results, tokens=TOKENS, itl_s=ITL_S, ttft_s=TTFT_S)
    cpu_s = st["driver_cpu_s"] + st["worker_cpu_s"]
    out = {"config": name, "backend": backend, "workers": n, "streams": c, "requests": total, "ok": err["ok"],
           "round_wall_s": st["round_wall_s"], "driver_cpu_s": st["driver_cpu_s"], "worker_cpu_s": st["worker_cpu_s"],
           "client_cpu_per_request_ms": 1e3 * cpu_s / total,
           "driver_cpu_per_request_us": 1e6 * st["driver_cpu_s"] / total,
           "ttft_err_p50_ms": err["ttft_err_p50_ms"], "ttft_vs_programmed_p50_ms": err["ttft_vs_programmed_p50_ms"],
           "itl_err_p50_pct": err["itl_err_p50_pct"], "lost_chunks": err["lost_chunks"],
           "result_lag_p50_ms": 1e3 * st["result_lag_p50_s"] if "result_lag_p50_s" in st else None,
           "result_lag_max_ms": 1e3 * st["result_lag_max_s"] if "result_lag_max_s" in st else None,
           "start_late_max_ms": 1e3 * st["start_late_max_s"] if "start_late_max_s" in st else None,
           "clocks": clocks}
    print(f"{name} overhead: {out['client_cpu_per_request_ms']:.2f} ms CPU/request (driver "
          f"{out['driver_cpu_per_request_us']:.0f} us), TTFT err {out['ttft_err_p50_ms']:.2f} ms, ITL err "
          f"{out['itl_err_p50_pct']:.2f} %, result lag p50 {out['result_lag_p50_ms']} ms", flush=True)
    return out, results[0]


def driver_cost(sample: dict[str, Any], n: int = 5000) -> dict[str, Any]:
    """What the driver pays per record besides receiving it: the runner's record (a result of
    OVERHEAD_STREAMS' shape plus the level fields) written through `JsonlWriter`; and the bytes
    one result takes on the wire (pickled, as Ray sends it)."""
    import pickle
    import tempfile

    from servelab.runfolder import JsonlWriter

    rec = {"study": "s", "config": "c", "level": 0, "bucket": f"in20-out{TOKENS}", "target_input_tokens": 20,
           "target_output_tokens": TOKENS, "shared_prefix": False, "concurrency": OVERHEAD_STREAMS, "rate_rps": 0.0,
           "arrival": "concurrency", "round": 0, "warmup": False, "seq": 1, "cache_salt": "0123456789ab-1",
           "scheduled_s": None, "send_lag_s": None, **sample}
    with tempfile.TemporaryDirectory() as d, JsonlWriter(Path(d) / "records.jsonl") as w:
        cpu0 = time.process_time()
        for _ in range(n):
            w.write(rec)
        cpu_s = time.process_time() - cpu0
    out = {"record_write_us": 1e6 * cpu_s / n, "record_json_bytes": len(json.dumps(rec)),
           "result_pickled_bytes": len(pickle.dumps(sample))}
    print(f"driver: {out['record_write_us']:.0f} us CPU per record written, {out['record_json_bytes']} B/record, "
          f"{out['result_pickled_bytes']} B/result on the wire", flush=True)
    return out


def driver_at_rate() -> dict[str, Any]:
    """Driver CPU per received result when results arrive fast (4-token requests, 1 ms gaps)."""
    from servelab.measure.ray_pool import RayWorkerPool

    got: list[Any] = []
    with RefProcess(ttft_s=0.002, itl_s=0.001) as srv:
        pool = RayWorkerPool(2, Server(base_url=srv.url, model="ref"), RATE_STREAMS)
        try:
            jobs = [Job(i, client.RequestSpec(prompt="rate", max_tokens=RATE_TOKENS, model="ref", seed=None))
                    for i in range(RATE_REQUESTS)]
            run_sync(pool.run_round(jobs[:RATE_STREAMS], RATE_STREAMS, 60, lambda *a: None))
            cpu0, t0 = time.process_time(), time.perf_counter()
            st = run_sync(pool.run_round(jobs, RATE_STREAMS, 60, lambda j, r, lag: got.append(r)))
            cpu_s, wall_s = time.process_time() - cpu0, time.perf_counter() - t0
        finally:
            pool.close()
    out = {"requests": RATE_REQUESTS, "ok": sum(r["ok"] for r in got), "streams": RATE_STREAMS,
           "requests_per_s": RATE_REQUESTS / wall_s, "driver_cpu_per_request_us": 1e6 * cpu_s / RATE_REQUESTS,
           "driver_cpu_frac": cpu_s / wall_s, "result_lag_p50_ms": 1e3 * st.get("result_lag_p50_s", float("nan"))}
    print(f"driver at {out['requests_per_s']:.0f} results/s: {out['driver_cpu_per_request_us']:.0f} us CPU per "
          f"result ({out['driver_cpu_frac'] * 100:.0f} % of a core)", flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "ray-scaleout.json"))
    ap.add_argument("--repeats", type=int, default=3, help="passes over the four configurations")
    ap.add_argument("--parts", default="sustained,overhead,rate",
                    help="which parts to run (overhead includes the driver's write cost); the others are kept "
                    "from --out")
    ap.add_argument("--smoke", type=Path, metavar="DIR",
                    help="every part at the smallest size; writes DIR/ray-scaleout.json")
    a = ap.parse_args()
    if a.smoke:
        globals().update(SMOKE_SIZES)
        a.out, a.repeats, a.parts = str(a.smoke / "ray-scaleout.json"), 1, "sustained,overhead,rate"
    parts = set(a.parts.split(","))
    doc: dict[str, Any] = json.loads(Path(a.out).read_text()) if parts != {"sustained", "overhead", "rate"} else {}
    import ray

    t0 = time.perf_counter()
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, logging_level="warning")
    ray_start_s = time.perf_counter() - t0
    try:
        if "sustained" in parts:
            doc["sustained"] = [{"repeat": rep, **scale(name, backend, n)}
                                for rep in range(a.repeats) for name, backend, n in CONFIGS]
        if "overhead" in parts:
            doc["overhead"] = []
            with RefProcess(ttft_s=TTFT_S, itl_s=ITL_S) as srv:
                for rep in range(a.repeats):
                    for name, backend, n in CONFIGS:
                        o, sample = overhead(name, backend, n, srv.url)
                        doc["overhead"].append({"repeat": rep, **o})
            doc["driver"] = driver_cost(sample)
        if "rate" in parts:
            doc["driver_at_rate"] = driver_at_rate()
    finally:
        ray.shutdown()
    doc.update({"what": "servelab client scale-out: local processes vs Ray actors (benchmarks/ray_scaleout.py)",
                "settings": {"levels": LEVELS, "ttft_s": TTFT_S, "itl_s": ITL_S, "tokens": TOKENS,
                             "itl_limit_pct": ITL_ERR_LIMIT_PCT, "overhead_streams": OVERHEAD_STREAMS,
                             "overhead_requests_per_stream": OVERHEAD_RPS, "rate_requests": RATE_REQUESTS,
                             "rate_streams": RATE_STREAMS, "rate_tokens": RATE_TOKENS, "ray_version": ray.__version__}})
    doc.setdefault("runs", []).append({"parts": sorted(parts), "machine": machine_facts(), "ray_init_s": ray_start_s,
                                       "wall_s": time.perf_counter() - t0})
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {a.out} ({doc['runs'][-1]['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
