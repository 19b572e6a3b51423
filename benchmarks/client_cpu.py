"""Client CPU per streamed token, and the timing error it causes, for HTTP client variants.

Against the reference server (own process, programmed 20 ms inter-token gap), each variant
streams c concurrent requests of `tokens` tokens (one warmup round first, to open connections)
and reports: client CPU microseconds per received chunk (process time of the measured round /
chunks), the median |measured gap - emitted gap| / emitted gap (ITL error, from the server's
emission stamps `servelab_t_ns` on the same monotonic clock) and the TTFT read error (first
chunk arrival - emission). Variants:

  servelab     lib/servelab/client.py as shipped (client.StreamClient + client.send)
  httpx-h11    httpx's default transport (httpcore + h11), aiter_lines, json.loads
  aiohttp      aiohttp alone (what `vllm bench serve` uses), line iteration, json.loads
  aiohttp-parser aiohttp alone, raw reads (iter_any) into servelab's StreamParser

    .venv/bin/python benchmarks/client_cpu.py --streams 64 256 --variants servelab,httpx-h11,aiohttp
    .venv/bin/python benchmarks/client_cpu.py --smoke DIR    # every variant, 2 streams x 4 tokens, on uvloop

`--smoke DIR` (make test runs it) leaves nothing out but size: every variant once at 2 streams of 4
tokens, written to DIR/client-cpu.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))

from servelab.measure import client as sc  # noqa: E402
from servelab.measure.selfcheck import RefProcess, free_port  # noqa: E402

VARIANTS = ("servelab", "httpx-h11", "aiohttp", "aiohttp-parser")
BODY = {"model": "ref", "prompt": "client cpu", "stream": True, "stream_options": {"include_usage": True}}


def _stamps(line: bytes | str, t_ns: int, out: list[tuple[int, int]]) -> None:
    if isinstance(line, bytes):
        line = line.decode()
    line = line.strip()
    if not line.startswith("data:") or line.endswith("[DONE]"):
        return
    obj = json.loads(line[5:])
    ch = obj.get("choices") or []
    if ch and ch[0].get("text") and "servelab_t_ns" in obj:
        out.append((t_ns, obj["servelab_t_ns"]))


async def one_httpx(http: Any, tokens: int) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    async with http.stream("POST", "/v1/completions", json={**BODY, "max_tokens": tokens}) as r:
        async for line in r.aiter_lines():
            _stamps(line, time.perf_counter_ns(), out)
    return out


async def one_aiohttp(session: Any, url: str, tokens: int) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    async with session.post(url + "/v1/completions", json={**BODY, "max_tokens": tokens}) as r:
        async for line in r.content:
            _stamps(line, time.perf_counter_ns(), out)
    return out


async def one_aiohttp_parser(session: Any, url: str, tokens: int) -> list[tuple[int, int]]:
    t0 = time.perf_counter_ns()
    p = sc.StreamParser(t0)
    async with session.post(url + "/v1/completions", json={**BODY, "max_tokens": tokens}) as resp:
        async for data in resp.content.iter_any():
            p.feed_bytes(data, time.perf_counter_ns())
            if p.done:
                break
    return [(int(t0 + t * 1e9), s) for t, s in zip(p.chunk_times_s, p.server_chunk_ns)]


async def one_servelab(http: Any, tokens: int) -> list[tuple[int, int]]:
    spec = sc.RequestSpec(prompt="client cpu", max_tokens=tokens, model="ref", api="completions", seed=None)
    res = await sc.send(http, spec, timeout_s=120)
    t0 = res.start_s * 1e9
    return [(int(t0 + t * 1e9), s) for t, s in zip(res.chunk_times_s, res.server_chunk_ns)]


async def level(variant: str, url: str, c: int, tokens: int) -> dict[str, Any]:
    if variant in ("aiohttp", "aiohttp-parser"):
        import aiohttp

        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=c + 4),
                                        timeout=aiohttp.ClientTimeout(total=None))
        one = one_aiohttp if variant == "aiohttp" else one_aiohttp_parser
        fn = lambda t: one(session, url, t)  # noqa: E731
        close = session.close
    else:
        if variant == "servelab":
            http = await sc.StreamClient(url, concurrency=c).__aenter__()
            fn = lambda t: one_servelab(http, t)  # noqa: E731
        else:
            import httpx

            http = httpx.AsyncClient(base_url=url, limits=httpx.Limits(max_connections=c + 4),
                                     timeout=httpx.Timeout(10, read=None))
            fn = lambda t: one_httpx(http, t)  # noqa: E731
        close = http.aclose
    try:
        await asyncio.gather(*(fn(1) for _ in range(c)))  # warmup: open c connections
        cpu0, w0 = time.process_time(), time.perf_counter()
        streams = await asyncio.gather(*(fn(tokens) for _ in range(c)))
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - w0
    finally:
        await close()
    chunks = sum(len(s) for s in streams)
    gap_err, gap_e, ttft_err = [], [], []
    for s in streams:
        if not s:
            continue
        a = np.array([x[0] for x in s], dtype=float)
        e = np.array([x[1] for x in s], dtype=float)
        ttft_err.append((a[0] - e[0]) / 1e6)
        gap_err.extend(np.abs(np.diff(a) - np.diff(e)) / 1e6)
        gap_e.extend(np.diff(e) / 1e6)
    return {"variant": variant, "streams": c, "chunks": chunks, "expected": c * tokens, "wall_s": round(wall, 3),
            "cpu_us_per_chunk": round(cpu / max(1, chunks) * 1e6, 1), "cpu_frac": round(cpu / wall, 3),
            "itl_err_pct": round(float(np.median(gap_err)) / float(np.median(gap_e)) * 100, 2) if gap_e else None,
            "ttft_read_err_p50_ms": round(float(np.median(ttft_err)), 3) if ttft_err else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--variants", default="servelab,httpx-h11,aiohttp", help=f"comma list of {', '.join(VARIANTS)}")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--itl", type=float, default=0.02)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--uvloop", action="store_true", help="run the clients on uvloop (servelab's runner does)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--smoke", type=Path, metavar="DIR",
                    help="every variant at the smallest size; writes DIR/client-cpu.json")
    a = ap.parse_args()
    if a.smoke:
        vars(a).update(streams=[2], variants=",".join(VARIANTS), tokens=4, itl=0.005, reps=1, uvloop=True,
                       out=a.smoke / "client-cpu.json")
    runner = asyncio.run
    if a.uvloop:
        import uvloop

        runner = uvloop.run
    rows = []
    with RefProcess(ttft_s=0.05, itl_s=a.itl, port=free_port("127.0.0.1", 8050), uvloop=False) as rp:
        for c in a.streams:
            for rep in range(a.reps):
                vs = a.variants.split(",")
                for v in (vs if rep % 2 == 0 else vs[::-1]):  # alternate the order
                    r = runner(level(v, rp.url, c, a.tokens))
                    r["rep"] = rep
                    rows.append(r)
                    print(json.dumps(r), flush=True)
    import pandas as pd

    df = pd.DataFrame(rows).groupby(["streams", "variant"], sort=False)[
        ["cpu_us_per_chunk", "cpu_frac", "itl_err_pct", "ttft_read_err_p50_ms", "chunks", "expected"]].median()
    print(df.to_string())
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(a).items()}
        a.out.write_text(json.dumps({"settings": settings, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
