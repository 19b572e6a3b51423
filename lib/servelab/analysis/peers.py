"""A peer tool's result, already read, as servelab-shaped records, so a report can show a peer's
measurement beside servelab's (`summary.summarize` works on the frame).

- `vllm_bench_frame`: the objects of a `vllm bench serve --save-result --save-detailed` JSON (also
  the JSON lines that `--append-result` writes: one object per line, each a round).
- `guidellm_frame`: the objects of GuideLLM's `benchmarks.json` report (v0.2-v0.3
  `scheduler_info` and 0.4+ `info.timings` request layouts; per-request computed fields).
- `json_objects`: a file's text as those objects (one JSON document, or JSON lines).
- `peer_summary`: `summarize()` of an imported frame, tagged with the tool.

Each row keeps the peer's own per-request numbers under servelab's column names; where the
definitions differ the row is still the peer's definition (benchmarks/README.md lists them):
vLLM's `latency` (-> e2e_s) ends at the last chunk carrying a choice, not at `[DONE]`; its TTFT
ends at the first chunk with a non-empty `choices` list (for chat that is the role-only chunk);
its per-request TPOT is (latency - ttft) / (output_tokens - 1), which is what `tpot_s` here is.
Not for running the peer tools (benchmarks/compare_vllm_bench.py does that) or reading their files
(`results.peers`, `results.formats`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pandas as pd

from ..schema.runfiles import RequestRecord
from ..summary import summarize
from .sglang_bench import sglang_bench_command

VLLM_BENCH = "vllm bench serve"
GUIDELLM = "guidellm"



def json_objects(text: str) -> list[dict[str, Any]]:
    """A result file's text as its objects: one JSON document (a list: its items), else JSON lines."""
    try:
        obj = json.loads(text)
        return obj if isinstance(obj, list) else [obj]
    except json.JSONDecodeError:
        return [json.loads(line) for line in text.splitlines() if line.strip()]


def _rate(v: Any) -> float:
    if v is None or v == "inf" or (isinstance(v, float) and math.isinf(v)):
        return 0.0  # closed loop / all at once: servelab's rate_rps 0
    return float(v)


def _per_request(out: int | None, ttft: float | None, e2e: float | None) -> dict[str, Any]:
    d: dict[str, Any] = {"decode_tps": None, "e2e_output_tps": None, "tpot_s": None}
    if out and e2e and e2e > 0:
        d["e2e_output_tps"] = out / e2e
    if out and out > 1 and e2e is not None and ttft is not None and e2e - ttft > 0:
        d["decode_tps"] = (out - 1) / (e2e - ttft)
        d["tpot_s"] = 1.0 / d["decode_tps"]
    return d


def _bucket(label: str | None, tin: int, tout: int) -> str:
    return label or f"in{tin}-out{tout}"


def vllm_bench_rows(res: dict[str, Any], *, config: str, bucket_label: str | None = None, round_: int = 0,
                    target_input_tokens: int | None = None, target_output_tokens: int | None = None,
                    seq0: int = 0) -> list[dict[str, Any]]:
    """Records of one `vllm bench serve` result object (see `vllm_bench_frame`)."""
    if "ttfts" not in res:
        raise ValueError("vllm bench serve result has no per-request data: run it with --save-result --save-detailed")
    ttfts = res["ttfts"]
    n = len(ttfts)
    itls = res.get("itls") or [[] for _ in range(n)]
    lat = res.get("latencies") or [t + sum(g) for t, g in zip(ttfts, itls)]
    ins = res.get("input_lens") or [None] * n
    outs = res.get("output_lens") or [None] * n
    errors = res.get("errors")
    starts = res.get("start_times")
    ok_flags = [not e for e in errors] if errors is not None else [bool(o) for o in outs]
    ok_in = [i for i in range(n) if ok_flags[i]]
    tin = target_input_tokens or int(np.median([ins[i] for i in ok_in if ins[i] is not None] or [0]))
    tout = target_output_tokens or int(np.median([outs[i] for i in ok_in if outs[i] is not None] or [0]))
    conc = res.get("max_concurrency") or res.get("num_prompts") or n
    rate = _rate(res.get("request_rate"))
    reconstructed = not starts
    dur = float(res.get("duration") or 0.0)
    rows = []
    for i in range(n):
        ok = ok_flags[i]
        ttft = float(ttfts[i]) if ok else None
        e2e = float(lat[i]) if ok else None
        out = int(outs[i]) if ok and outs[i] is not None else None
        chunk_times: list[float] = []
        if ok:
            t = ttft
            chunk_times = [t]
            for g in itls[i]:
                t += g
                chunk_times.append(t)
        if starts:
            start = float(starts[i])
            end = start + float(lat[i] or 0.0)
        else:
            # no start times: every request spans the benchmark duration, so round wall time
            # = duration and aggregate output tok/s = their output_throughput
            start, end = 0.0, dur
        err = errors[i] if errors is not None else ("" if ok else "failed")
        rows.append({
            "config": config, "bucket": _bucket(bucket_label, tin, tout), "target_input_tokens": tin,
            "target_output_tokens": tout, "concurrency": int(conc), "rate_rps": rate, "round": round_,
            "warmup": False, "seq": seq0 + i, "ok": ok,
            "error_kind": None if ok else ("http_status" if err and "\n" not in err and len(err) < 60 else "peer_error"),
            "error_detail": None if ok else (err or "")[:600],
            "ttft_s": ttft, "e2e_s": e2e, "prompt_tokens": ins[i], "output_tokens": out,
            **_per_request(out, ttft, e2e), "chunk_times_s": chunk_times, "start_s": start, "end_s": end,
            "tool": VLLM_BENCH, "times_reconstructed": reconstructed,
            # vLLM's own per-request definitions (its TTFT at the first chunk with a choice, for chat the role chunk)
            "tool_ttft_s": ttft, "tool_tpot_s": _per_request(out, ttft, e2e)["tpot_s"],
        })
    return rows


def vllm_bench_frame(objs: Iterable[dict[str, Any]], *, config: str, bucket_label: str | None = None,
                     target_input_tokens: int | None = None, target_output_tokens: int | None = None) -> pd.DataFrame:
    """`vllm bench serve --save-result --save-detailed` result objects -> servelab-shaped records.

    One row per request: ttft_s = their `ttfts[i]`, e2e_s = `latencies[i]`, prompt/output tokens =
    `input_lens`/`output_lens` (usage when the server sent it, else their tokenizer count),
    chunk_times_s = ttft + cumulative `itls[i]` (so servelab's pooled ITL equals theirs),
    start_s = `start_times[i]` (their perf_counter clock; if absent, reconstructed from `duration`
    so the aggregate output tok/s equals their `output_throughput`), tpot_s = (e2e - ttft) /
    (output - 1) = their TPOT. Each object (a file, a JSON line) is a round: 0, 1, ...
    """
    rows: list[dict[str, Any]] = []
    for rnd, obj in enumerate(objs):
        rows += vllm_bench_rows(obj, config=config, bucket_label=bucket_label, round_=rnd,
                                target_input_tokens=target_input_tokens,
                                target_output_tokens=target_output_tokens, seq0=len(rows))
    return pd.DataFrame(rows, columns=RequestRecord.peer_columns())


# -- GuideLLM -----------------------------------------------------------------------------------

def _timings(req: dict[str, Any]) -> dict[str, Any]:
    info = req.get("info") or {}
    if isinstance(info.get("timings"), dict):  # 0.4+
        t = info["timings"]
        return {"start": t.get("request_start"), "first": t.get("first_token_iteration"),
                "last": t.get("last_token_iteration"), "end": t.get("request_end")}
    si = (req.get("scheduler_info") or {}).get("request_timings") or {}
    if si:  # 0.3
        return {"start": si.get("request_start"), "first": si.get("first_iteration"),
                "last": si.get("last_iteration"), "end": si.get("request_end")}
    return {"start": req.get("start_time"), "first": req.get("first_token_time"),  # 0.2
            "last": req.get("last_token_time"), "end": req.get("end_time")}


def _strategy(bench: dict[str, Any]) -> dict[str, Any]:
    for path in (("config", "strategy"), ("args", "strategy"), ("scheduler", "strategy")):
        d: Any = bench
        for k in path:
            d = d.get(k) if isinstance(d, dict) else None
        if isinstance(d, dict):
            return d
    return {}


def guidellm_window(bench: dict[str, Any]) -> tuple[float, float] | None:
    """GuideLLM's measurement window of one benchmark, (start, end) in wall-clock seconds, where its
    report stores requests outside it: from 0.4 on every request is stored (warm-up and cool-down
    too) and its metrics count those that overlap the window (`get_within_range`: ended at or after
    its start and started at or before its end); the benchmark's `start_time` / `end_time` are the
    window. None for 0.2-0.3 reports (`run_stats`), which drop warm-up and cool-down requests as they
    collect them: what is stored is the window."""
    if "run_stats" in bench or bench.get("start_time") is None or bench.get("end_time") is None:
        return None
    if not any(k in bench for k in ("scheduler_metrics", "scheduler_state", "config")):
        return None
    return float(bench["start_time"]), float(bench["end_time"])


def _outside(start: float | None, end: float | None, window: tuple[float, float] | None) -> str | None:
    """Why GuideLLM left a request out of its window (None: inside)."""
    if window is None:
        return None
    lo, hi = window
    if end is not None and end < lo:
        return "warm-up"
    if start is not None and start > hi:
        return "cool-down"
    if start is None and end is not None and end > hi:
        return "cool-down"
    if start is None and end is None:
        return "cancelled before it started"
    return None


def guidellm_rows(bench: dict[str, Any], *, config: str, bucket_label: str | None = None, round_: int = 0,
                  seq0: int = 0) -> list[dict[str, Any]]:
    """Records of one GuideLLM benchmark (one strategy / rate) of a `benchmarks.json` report. A request
    outside its measurement window (`guidellm_window`) is kept, flagged `warmup` and `excluded`
    (warm-up, cool-down), as GuideLLM leaves it out of its metrics. Beside servelab's fields each row
    keeps GuideLLM's own per-request definitions, computed from its timings: `tool_itl_s` = (last
    token - first token) / (output - 1), `tool_tpot_s` = request latency / output, and `last_token_s`
    (wall clock)."""
    reqs = bench.get("requests") or {}
    items = [(r, True) for r in reqs.get("successful") or []]
    items += [(r, False) for k in ("incomplete", "errored") for r in reqs.get(k) or []]
    st = _strategy(bench)
    kind = str(st.get("type_", st.get("type", "")))
    rate = float(st["rate"]) if kind in ("constant", "poisson", "async") and st.get("rate") else 0.0
    conc = int(st.get("streams") or st.get("max_concurrency") or (1 if kind == "synchronous" else 0)) or len(items)
    window = guidellm_window(bench)
    ok_reqs = [r for r, ok in items if ok]
    tin = int(np.median([r.get("prompt_tokens") or 0 for r in ok_reqs] or [0]))
    tout = int(np.median([r.get("output_tokens") or 0 for r in ok_reqs] or [0]))
    rows = []
    for i, (r, ok) in enumerate(items):
        t = _timings(r)
        start = t["start"] if t["start"] is not None else r.get("request_start_time")
        end = t["end"] if t["end"] is not None else r.get("request_end_time")
        ttft = r.get("time_to_first_token_ms")
        ttft = ttft / 1000 if ttft is not None else (t["first"] - start if t["first"] and start else None)
        e2e = r.get("request_latency") or ((end - start) if start is not None and end is not None else None)
        out = r.get("output_tokens")
        itl_ms = r.get("inter_token_latency_ms")  # (last - first) / (out - 1): servelab's TPOT
        per = _per_request(out if ok else None, ttft if ok else None, e2e if ok else None)
        if ok and itl_ms:
            per["tpot_s"], per["decode_tps"] = itl_ms / 1000, 1000 / itl_ms
        tool_itl = ((t["last"] - t["first"]) / (out - 1) if ok and t["first"] and t["last"] and out and out > 1
                    else (itl_ms / 1000 if ok and itl_ms is not None else None))
        tool_tpot = e2e / out if ok and e2e and out else None
        excluded = _outside(start, end, window)
        rows.append({
            "config": config, "bucket": _bucket(bucket_label, tin, tout), "target_input_tokens": tin,
            "target_output_tokens": tout, "concurrency": conc, "rate_rps": rate, "round": round_,
            "warmup": excluded is not None, "excluded": excluded, "seq": seq0 + i, "ok": ok,
            "error_kind": None if ok else "peer_error",
            "error_detail": None if ok else str(r.get("error") or (r.get("info") or {}).get("error") or "")[:600],
            "ttft_s": ttft if ok else None, "e2e_s": e2e if ok else None, "prompt_tokens": r.get("prompt_tokens"),
            "output_tokens": out if ok else None, **per,
            # GuideLLM keeps first and last token times only: no per-chunk gaps
            "chunk_times_s": [ttft] if ok and ttft is not None else [],
            "start_s": float(start or end or 0.0), "end_s": float(end or start or 0.0), "tool": GUIDELLM,
            "times_reconstructed": False, "tool_itl_s": tool_itl, "tool_tpot_s": tool_tpot,
            "last_token_s": float(t["last"]) if ok and t["last"] else None,
        })
    return rows


def guidellm_frame(objs: Iterable[dict[str, Any]], *, config: str, bucket_label: str | None = None) -> pd.DataFrame:
    """The objects of a GuideLLM `benchmarks.json` -> servelab-shaped records; each benchmark
    (strategy) is a level.

    Uses its per-request computed fields: time_to_first_token_ms, inter_token_latency_ms
    ((last - first token) / (output - 1), servelab's TPOT), request_latency, prompt/output tokens.
    GuideLLM keeps only first/last token times, so servelab's pooled ITL is not available.
    """
    benches = [b for o in objs for b in (o.get("benchmarks") or [o])]
    rows: list[dict[str, Any]] = []
    for b in benches:
        rows += guidellm_rows(b, config=config, bucket_label=bucket_label, seq0=len(rows))
    return pd.DataFrame(rows, columns=RequestRecord.peer_columns())


def peer_summary(df: pd.DataFrame) -> pd.DataFrame:
    """`summary.summarize` of imported records, with the tool that measured them."""
    s = summarize(df)
    if not s.empty:
        tools = df.groupby("config")["tool"].first() if "tool" in df else None
        s.insert(1, "tool", [tools.get(c) if tools is not None else None for c in s["config"]])
    return s


def vllm_bench_reported(res: dict[str, Any]) -> dict[str, Any]:
    """vLLM's own headline numbers from a result object (its definitions), in servelab's units."""
    ms = lambda k: res[k] / 1000 if res.get(k) is not None else None  # noqa: E731
    return {"completed": res.get("completed"), "failed": res.get("failed"), "duration_s": res.get("duration"),
            "ttft_p50_s": ms("median_ttft_ms"), "ttft_p95_s": ms("p95_ttft_ms"), "tpot_p50_s": ms("median_tpot_ms"),
            "itl_p50_s": ms("median_itl_ms"), "e2e_p50_s": ms("median_e2el_ms"),
            "output_tps": res.get("output_throughput"), "total_output_tokens": res.get("total_output_tokens")}


def vllm_bench_command(base_url: str, model: str, tokenizer: str, input_len: int, output_len: int, concurrency: int,
                       num_prompts: int, result_file: Path, *, python: str = "python3", api: str = "chat",
                       seed: int = 42, warmups: int = 0, label: str | None = None) -> list[str]:
    """argv of one `vllm bench serve` run on the random dataset with fixed lengths (ignore_eos),
    at most `concurrency` requests in flight, result and per-request details saved as
    `result_file`. The one builder the study runner (`lanes`) and benchmarks/compare_vllm_bench.py share."""
    endpoint, backend = ("/v1/chat/completions", "openai-chat") if api == "chat" else ("/v1/completions", "openai")
    cmd = [python, "-m", "vllm.entrypoints.cli.main", "bench", "serve", "--backend", backend,
           "--endpoint", endpoint, "--base-url", base_url.rstrip("/").removesuffix("/v1"),
           "--model", model, "--tokenizer", tokenizer, "--dataset-name", "random",
           "--random-input-len", str(input_len), "--random-output-len", str(output_len), "--ignore-eos",
           "--num-prompts", str(num_prompts), "--max-concurrency", str(concurrency), "--seed", str(seed),
           "--temperature", "0", "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,95,99",
           "--save-result", "--save-detailed", "--result-dir", str(Path(result_file).parent),
           "--result-filename", Path(result_file).name, "--disable-tqdm"]
    if warmups:
        cmd += ["--num-warmups", str(warmups)]
    if label:
        cmd += ["--label", label]
    return cmd


def peer_command(run: Any, base_url: str, model_dir: str, out_dir: Path, *, python: str = "python3") -> tuple[list[str], Path]:
    """(argv, result file) of one `peers:` entry (schema.PeerRun) against a server."""
    n = run.num_prompts or 4 * run.concurrency
    stem = f"in{run.input_tokens}-out{run.output_tokens}-c{run.concurrency}"
    if run.tool == "vllm-bench":
        out = Path(out_dir) / f"vllm-bench-{stem}.json"
        return vllm_bench_command(base_url, model_dir, model_dir, run.input_tokens, run.output_tokens,
                                  run.concurrency, n, out, python=python), out
    out = Path(out_dir) / f"sglang-bench-{stem}.jsonl"
    return sglang_bench_command(base_url, model_dir, run.input_tokens, run.output_tokens, run.concurrency, n, out,
                                python=python), out
