"""Client self-check: servelab's own measurement error against the reference server.

`calibrate()` starts the reference server (`servelab.measure.refserver`) in its own process, so it
does not share the client's GIL or core, then runs servelab's own client (`runner.run_round`
-> `client.send`, or `workers.WorkerPool` with workers > 1, or `ray_pool.RayWorkerPool` actors
with backend="ray", their times shifted into this process's clock) at each concurrency level and
compares what the client measured with what the server stamped on every text chunk
(`servelab_t_ns` = emission time, `servelab_due_ns` = scheduled time, on the machine-wide
CLOCK_MONOTONIC that the client's `perf_counter_ns` also reads).

Per level (all times in ms):
- TTFT error = measured ttft - (first text chunk's emission - request send time)
  = arrival - emission of the first chunk (median, p95): the client's read-side error;
- TTFT vs programmed = measured ttft - programmed ttft: the whole bias, which also holds the
  time the request spends in the client's own send path (httpx request build, pooled
  connection, write) before the server sees it, plus the server's timer lateness (~0.1 ms);
- ITL error = median |measured gap - emitted gap| / median emitted gap (%), pooled gaps;
- lost chunks = expected text chunks (ceil(tokens / tokens_per_chunk) per request sent)
  - text chunks received; failed requests count all their missing chunks;
- late chunks = chunks whose arrival - emission exceeds `late_ms`;
- server lateness = emission - schedule (`servelab_due_ns`): when the reference server falls
  behind its own schedule it, not the client, limits the level. Exact when the client keeps
  the due stamps (`RequestOutcome.server_due_ns`); otherwise a lower bound from the emission stamps
  alone (within one stream, lateness_i - min_j lateness_j = (e_i - i*itl) - min_j(e_j - j*itl),
  and lateness >= 0), marked `server_late_exact = False`;
- event-loop lag p50/p99 and client CPU (`runner.LoopMonitor`), reference-server CPU.

`verdict`: "ok" when TTFT median error <= 1 ms, ITL median error <= 2 %, and no request
failed and no chunk was lost; otherwise "server-limited" when the reference server was
itself behind schedule (lateness p50 over `SERVER_LATE_LIMIT_MS`) or saturated its core,
else "client-limited". Not a load generator for studies (`runner`), not a report (`report`).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import math
import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable

import httpx
import numpy as np
import pandas as pd
import psutil

from ..hosts.base import Server
from ..runfolder import write_json
from ..schema.parts import WorkerBackend
from . import client
from .pools import make_pool
from .refserver import Behaviour, RefServer
from .rounds import Job, run_round, run_sync

DEFAULT_LEVELS = (1, 4, 16, 64, 256, 512, 1024)
TTFT_ERR_LIMIT_MS = 1.0  # target: TTFT median error <= 1 ms
ITL_ERR_LIMIT_PCT = 2.0  # target: ITL median error <= 2 %
# A healthy reference server is 0.1-0.3 ms behind schedule (0.5-1 ms on uvloop's millisecond
# timers); this far behind (p50, or 10 % of the gap if larger) = server-limited.
SERVER_LATE_LIMIT_MS = 2.0
SERVER_CPU_LIMIT = 0.95  # ... or using this share of its core
DEFAULT_PORT = 8050

COLUMNS = ["streams", "requests", "ok", "failed", "wall_s",
           "ttft_err_p50_ms", "ttft_err_p95_ms", "ttft_vs_programmed_p50_ms",
           "itl_err_p50_pct", "itl_abs_err_p95_ms", "itl_emitted_p50_ms", "itl_measured_p50_ms",
           "chunks_expected", "chunks_received", "lost_chunks", "late_chunks", "late_pct",
           "delivery_p50_ms", "delivery_p99_ms",
           "server_late_p50_ms", "server_late_p99_ms", "server_late_exact", "server_cpu_frac",
           "loop_lag_p50_ms", "loop_lag_p99_ms", "client_cpu_frac", "load_avg_1m",
           "verdict", "reason"]


# -- the reference server in its own process ---------------------------------------------------

def free_port(host: str, start: int, stop: int = 8069) -> int:
    for p in range(start, stop + 1):
        with socket.socket() as s:
            try:
                s.bind((host, p))
                return p
            except OSError:
                continue
    raise RuntimeError(f"no free port in {start}-{stop}")


class RefProcess:
    """`python -m servelab.measure.refserver` as a child process: `with RefProcess(...) as rp: rp.url`.
    Without `port`, the first free port from `first_port`; when another process binds that port between
    the check and the server's own bind (two test workers starting servers at once), the next free one."""

    ATTEMPTS = 5  # ports tried when others keep taking them first

    def __init__(self, *, ttft_s: float, itl_s: float, tokens_per_chunk: int = 1, jitter_s: float = 0.0,
                 port: int | None = None, first_port: int = DEFAULT_PORT, host: str = "127.0.0.1",
                 uvloop: bool = False, slots: int = 0, extra_args: Iterable[str] = ()) -> None:
        self.host = host
        self.fixed_port = port
        self.first_port = first_port
        self.port = port or free_port(host, first_port)
        self.args = ["--ttft", repr(ttft_s), "--itl", repr(itl_s), "--jitter", repr(jitter_s),
                     "--tokens-per-chunk", str(tokens_per_chunk), *(["--uvloop"] if uvloop else []),
                     *(["--slots", str(slots)] if slots else []), *extra_args]
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def cmd(self) -> list[str]:
        return [sys.executable, "-m", "servelab.measure.refserver", "--host", self.host, "--port", str(self.port),
                *self.args]

    def start(self, timeout_s: float = 20.0) -> "RefProcess":
        env = dict(os.environ)
        src = str(Path(__file__).resolve().parents[1])  # lib/, in case servelab is not installed
        env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        for attempt in range(self.ATTEMPTS):
            self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
            deadline = time.monotonic() + timeout_s
            while self.proc.poll() is None:
                if self.serving():
                    return self
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"reference server not healthy on {self.url} after {timeout_s:g} s")
                time.sleep(0.1)
            err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
            self.stop()
            if self.fixed_port is not None or "address already in use" not in err.lower() or \
                    attempt == self.ATTEMPTS - 1:
                raise RuntimeError(f"reference server exited ({self.proc.returncode}): {err[-500:]}")
            self.port = free_port(self.host, self.first_port)  # another process took it first
        raise AssertionError("unreachable")

    def serving(self) -> bool:
        """Healthy, and this process is the one listening on the port (not another that bound it first)."""
        assert self.proc is not None
        try:
            mine = any(c.status == psutil.CONN_LISTEN and c.laddr.port == self.port
                       for c in psutil.Process(self.proc.pid).net_connections(kind="tcp"))
        except psutil.Error:
            return False
        try:
            return mine and httpx.get(self.url + "/health", timeout=1.0).status_code == 200
        except httpx.HTTPError:
            return False

    def cpu_s(self) -> float | None:
        """CPU seconds the server process has used so far (None if unknown)."""
        if self.proc is None:
            return None
        try:
            t = psutil.Process(self.proc.pid).cpu_times()
            return t.user + t.system
        except Exception:
            return None

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc and self.proc.stderr:
            self.proc.stderr.close()

    def __enter__(self) -> "RefProcess":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


# -- per-level error metrics ----------------------------------------------------------------------

def _get(r: Any, k: str, default: Any = None) -> Any:
    return r.get(k, default) if isinstance(r, dict) else getattr(r, k, default)


def _pct(a: Any, q: float) -> float:
    a = np.asarray(a, dtype=float)
    return float(np.percentile(a, q)) if a.size else float("nan")


def level_errors(results: list[Any], *, tokens: int, itl_s: float, ttft_s: float, tokens_per_chunk: int = 1,
                 late_ms: float = 5.0) -> dict[str, Any]:
    """Error metrics of one level from client outcomes (`RequestOutcome`s or their dumps)."""
    k = max(1, tokens_per_chunk)
    per_req = math.ceil(tokens / k)
    ttft_err, ttft_vs_prog, gaps_m, gaps_e, abs_err, delivery, late_srv = [], [], [], [], [], [], []
    received = ok = 0
    exact = True
    for r in results:
        times = list(_get(r, "chunk_times_s") or [])
        stamps = list(_get(r, "server_chunk_ns") or [])
        received += len(times)
        if not _get(r, "ok"):
            continue
        ok += 1
        ttft_vs_prog.append(((_get(r, "ttft_s") or 0.0) - ttft_s) * 1e3)
        if not stamps or len(stamps) != len(times):
            continue
        start_ns = _get(r, "start_s") * 1e9
        arr = start_ns + np.asarray(times) * 1e9  # arrival, absolute ns (client clock)
        emi = np.asarray(stamps, dtype=float)  # emission, absolute ns (server, same clock)
        d = (arr - emi) / 1e6
        delivery.extend(d.tolist())
        ttft_err.append(float(d[0]))  # = ttft - (e0 - start)
        if len(times) > 1:
            gm, ge = np.diff(arr) / 1e6, np.diff(emi) / 1e6
            gaps_m.extend(gm.tolist())
            gaps_e.extend(ge.tolist())
            abs_err.extend(np.abs(gm - ge).tolist())
        due = _get(r, "server_due_ns")
        if due and len(due) == len(stamps):
            late_srv.extend(((emi - np.asarray(due, dtype=float)) / 1e6).tolist())
        else:  # lower bound: lateness relative to the stream's least-late chunk (lateness >= 0)
            exact = False
            sched = (np.arange(len(emi)) * k + k - 1) * itl_s * 1e9
            rel = emi - sched
            late_srv.extend(((rel - rel.min()) / 1e6).tolist())
    expected = per_req * len(results)
    med_e = _pct(gaps_e, 50)
    itl_err = 100.0 * _pct(abs_err, 50) / med_e if gaps_e and med_e > 0 else float("nan")
    late = int(np.sum(np.asarray(delivery) > late_ms)) if delivery else 0
    return {
        "requests": len(results), "ok": ok, "failed": len(results) - ok,
        "ttft_err_p50_ms": _pct(ttft_err, 50), "ttft_err_p95_ms": _pct(ttft_err, 95),
        "ttft_vs_programmed_p50_ms": _pct(ttft_vs_prog, 50),
        "itl_err_p50_pct": itl_err, "itl_abs_err_p95_ms": _pct(abs_err, 95),
        "itl_emitted_p50_ms": med_e, "itl_measured_p50_ms": _pct(gaps_m, 50),
        "chunks_expected": expected, "chunks_received": received, "lost_chunks": max(0, expected - received),
        "late_chunks": late, "late_pct": 100.0 * late / len(delivery) if delivery else float("nan"),
        "delivery_p50_ms": _pct(delivery, 50), "delivery_p99_ms": _pct(delivery, 99),
        "server_late_p50_ms": _pct(late_srv, 50), "server_late_p99_ms": _pct(late_srv, 99),
        "server_late_exact": bool(exact and late_srv),
    }


def verdict(row: dict[str, Any], *, ttft_limit_ms: float = TTFT_ERR_LIMIT_MS,
            itl_limit_pct: float = ITL_ERR_LIMIT_PCT, server_late_limit_ms: float = SERVER_LATE_LIMIT_MS,
            server_cpu_limit: float = SERVER_CPU_LIMIT) -> tuple[str, str]:
    """("ok" | "client-limited" | "server-limited", reason) for one level's metrics."""
    problems = []
    te, ie = row.get("ttft_err_p50_ms"), row.get("itl_err_p50_pct")
    if te is None or not np.isfinite(te) or te > ttft_limit_ms:
        problems.append(f"TTFT median error {te:.2f} ms > {ttft_limit_ms:g} ms" if te is not None and np.isfinite(te)
                        else "no TTFT error measured")
    if ie is None or not np.isfinite(ie) or ie > itl_limit_pct:
        problems.append(f"ITL median error {ie:.1f} % > {itl_limit_pct:g} %" if ie is not None and np.isfinite(ie)
                        else "no ITL error measured")
    if row.get("failed"):
        problems.append(f"{row['failed']} requests failed")
    if row.get("lost_chunks"):
        problems.append(f"{row['lost_chunks']} chunks lost")
    if not problems:
        return "ok", ""
    late, cpu = row.get("server_late_p50_ms"), row.get("server_cpu_frac")
    server = []
    if late is not None and np.isfinite(late) and late > server_late_limit_ms:
        server.append(f"reference server {late:.1f} ms behind schedule (p50)")
    if cpu is not None and np.isfinite(cpu) and cpu >= server_cpu_limit:
        server.append(f"reference server used {cpu * 100:.0f} % of its core")
    if server:
        return "server-limited", "; ".join(problems + server)
    return "client-limited", "; ".join(problems)


# -- the run --------------------------------------------------------------------------------------

def _warm_jobs(c: int, api: str) -> list[Job]:
    return [Job(-1 - i, client.RequestSpec(prompt="warm up", max_tokens=1, model="ref", api=api, seed=None))
            for i in range(c)]


async def _run_level_inprocess(url: str, specs: list[client.RequestSpec], c: int,
                               timeout_s: float) -> tuple[list[Any], dict[str, Any]]:
    results: list[Any] = []

    def on_result(job: Job, res: client.RequestOutcome, lag: float | None) -> None:
        results.append(res)

    async with client.StreamClient(url, concurrency=c) as http:
        # warmup round (not measured): opens the c keep-alive connections the level reuses, as a
        # run's warmup rounds do; otherwise the level's TTFTs include connection set-up bursts
        await run_round(http, _warm_jobs(c, specs[0].api), c, timeout_s, lambda *a: None, asyncio.Event())
        stats = await run_round(http, [Job(i, s) for i, s in enumerate(specs)], c, timeout_s, on_result,
                                asyncio.Event())
    return results, stats


def calibrate(levels: Iterable[int] = DEFAULT_LEVELS, ttft_s: float = 0.1, itl_s: float = 0.02,
              tokens: int = 64, workers: int = 1, server_process: bool = True, *, backend: str = "local",
              ray_address: str | None = None,
              requests_per_stream: int = 1, min_requests: int = 4, tokens_per_chunk: int = 1,
              api: str = "chat", port: int | None = None, uvloop_server: bool = False, late_ms: float = 5.0,
              timeout_s: float | None = None, out: Path | str | None = None,
              quiet: bool = False, log: Callable[[str], None] = print) -> pd.DataFrame:
    """Measure servelab's client error against the reference server at each stream count.

    Each level sends max(c * requests_per_stream, min_requests) requests of `tokens` tokens
    with c in flight (closed loop), after an unmeasured warmup round of c one-token requests
    that opens the connections, on the event loop the runner uses (`rounds.run_sync`: uvloop).
    `workers > 1` sends through `workers.WorkerPool` processes; `backend="ray"` through that many
    Ray actors (any count; `ray_address` as in `workload.workers.address`, None = a local Ray
    unless one is already initialized); `uvloop_server` trades the reference server's
    precise timers for uvloop. Returns one row per level (columns `COLUMNS`); writes them to
    `out` (JSON with the settings and machine facts) when given, and prints the table unless
    `quiet`.
    """
    levels = [int(c) for c in levels]
    timeout_s = timeout_s or max(60.0, 10 * (ttft_s + tokens * itl_s))
    settings = {"levels": levels, "ttft_s": ttft_s, "itl_s": itl_s, "tokens": tokens, "workers": workers,
                "backend": backend, "ray_address": ray_address,
                "server_process": server_process, "requests_per_stream": requests_per_stream,
                "min_requests": min_requests, "tokens_per_chunk": tokens_per_chunk, "api": api,
                "uvloop_server": uvloop_server, "late_ms": late_ms}
    rows: list[dict[str, Any]] = []
    server_cm: Any
    if server_process:
        server_cm = RefProcess(ttft_s=ttft_s, itl_s=itl_s, tokens_per_chunk=tokens_per_chunk, port=port,
                               uvloop=uvloop_server)
    else:
        server_cm = RefServer(Behaviour(ttft_s=ttft_s, itl_s=itl_s, tokens_per_chunk=tokens_per_chunk),
                              port=port or 0)
    with server_cm as srv:
        spec = workers if backend == "local" else WorkerBackend(backend=backend, count=workers, address=ray_address)
        pool = make_pool(spec, Server(base_url=srv.url, model="ref"), max(levels))
        try:
            for c in levels:
                n = max(c * requests_per_stream, min_requests)
                row = _level_row(srv, pool, c, n, server_process=server_process, tokens=tokens, itl_s=itl_s,
                                 ttft_s=ttft_s, tokens_per_chunk=tokens_per_chunk, late_ms=late_ms, api=api,
                                 timeout_s=timeout_s)
                rows.append(row)
                if not quiet:
                    log(f"  {c:>5} streams: TTFT err p50 {row['ttft_err_p50_ms']:.2f} ms, ITL err "
                        f"{row['itl_err_p50_pct']:.2f} %, server late p50 {row['server_late_p50_ms']:.2f} ms "
                        f"-> {row['verdict']}")
        finally:
            if pool:
                pool.close()
                settings["worker_clocks"] = pool.describe()  # offsets at start and at close
    df = pd.DataFrame(rows, columns=COLUMNS)
    if out:
        write_result(df, Path(out), settings)
    if not quiet:
        log(format_table(df))
    return df


def _level_row(srv: Any, pool: Any, c: int, n: int, *, server_process: bool, tokens: int, itl_s: float,
               ttft_s: float, tokens_per_chunk: int, late_ms: float, api: str, timeout_s: float) -> dict[str, Any]:
    """One level: n requests with c in flight (after a warmup round), measured against the server's stamps."""
    specs = [client.RequestSpec(prompt="calibrate the client", max_tokens=tokens, model="ref", api=api,
                            seed=None) for _ in range(n)]
    load0 = os.getloadavg()[0]
    cpu0, t0 = (srv.cpu_s() if server_process else None), time.perf_counter()
    if pool:
        results: list[Any] = []

        def on_result(job: Job, res: dict[str, Any], lag: float | None) -> None:
            results.append(res)

        run_sync(pool.run_round(_warm_jobs(c, api), c, timeout_s, lambda *a: None))
        stats = run_sync(pool.run_round([Job(i, s) for i, s in enumerate(specs)], c, timeout_s, on_result))
    else:
        results, stats = run_sync(_run_level_inprocess(srv.url, specs, c, timeout_s))
    wall = time.perf_counter() - t0
    cpu1 = srv.cpu_s() if server_process else None
    row: dict[str, Any] = {"streams": c, "wall_s": wall}
    row.update(level_errors(results, tokens=tokens, itl_s=itl_s, ttft_s=ttft_s,
                            tokens_per_chunk=tokens_per_chunk, late_ms=late_ms))
    row["server_cpu_frac"] = ((cpu1 - cpu0) / wall) if cpu0 is not None and cpu1 is not None else float("nan")
    row["loop_lag_p50_ms"] = stats.get("loop_lag_p50_s", float("nan")) * 1e3
    row["loop_lag_p99_ms"] = stats.get("loop_lag_p99_s", float("nan")) * 1e3
    row["client_cpu_frac"] = stats.get("cpu_frac", float("nan"))
    row["load_avg_1m"] = max(load0, os.getloadavg()[0])
    row["verdict"], row["reason"] = verdict(row, server_late_limit_ms=max(SERVER_LATE_LIMIT_MS,
                                                                          0.1 * itl_s * 1e3))
    return row


def machine_facts() -> dict[str, Any]:
    return {"cpu_count": os.cpu_count(), "load_avg": list(os.getloadavg()), "python": platform.python_version(),
            "platform": platform.platform(), "uvloop_available": _has("uvloop")}


def _has(mod: str) -> bool:
    return importlib.util.find_spec(mod) is not None


def write_result(df: pd.DataFrame, path: Path, settings: dict[str, Any]) -> Path:
    recs = json.loads(df.to_json(orient="records"))
    ok = df[df["verdict"] == "ok"]["streams"]
    write_json(path, {"settings": settings, "machine": machine_facts(),
                      "limits": {"ttft_err_p50_ms": TTFT_ERR_LIMIT_MS, "itl_err_p50_pct": ITL_ERR_LIMIT_PCT,
                                 "server_late_p50_ms": SERVER_LATE_LIMIT_MS},
                      "max_ok_streams": int(ok.max()) if len(ok) else None,
                      "levels": recs})
    return path


def format_table(df: pd.DataFrame) -> str:
    """The self-check as a fixed-width table; every level that is not "ok" says why."""
    if df.empty:
        return "(no levels)"
    cols = {"streams": "streams", "ok": "ok", "ttft_err_p50_ms": "TTFT err p50 ms",
            "ttft_err_p95_ms": "p95 ms", "itl_err_p50_pct": "ITL err %", "lost_chunks": "lost",
            "late_pct": "late %", "server_late_p50_ms": "srv late p50 ms", "server_late_p99_ms": "p99 ms",
            "server_cpu_frac": "srv CPU", "loop_lag_p50_ms": "lag p50 ms", "loop_lag_p99_ms": "lag p99 ms",
            "client_cpu_frac": "cli CPU", "verdict": "verdict"}
    t = df[list(cols)].rename(columns=cols)
    text = t.to_string(index=False, float_format=lambda v: f"{v:.2f}")
    notes = [f"  {r.streams} streams: {r.verdict}: {r.reason}" for r in df.itertuples() if r.verdict != "ok"]
    exact = bool(df["server_late_exact"].all())
    foot = ("" if exact else "\n(server lateness: lower bound from emission stamps; the client did not keep "
            "servelab_due_ns)")
    return text + ("\n" + "\n".join(notes) if notes else "") + foot
