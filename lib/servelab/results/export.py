"""A servelab run's records written in another tool's result format, one run of the tool per level
and round, so that `servelab import` of the file gives the run's requests back (the round-trip test
of issue 34). What each format can hold:

- AIPerf profile_export.jsonl (+ its profile_export_aiperf.json summary, for the concurrency):
  TTFT, the gaps between text chunks, e2e, tokens, start and end: everything.
- `vllm bench serve` JSON: TTFT, the gaps, e2e (`latencies`), tokens, start times: everything.
- SGLang bench_serving JSONL: TTFT, the gaps and tokens; no per-request latency (an import ends e2e
  at the last text chunk) and no start times (every request spans the run's duration).
- GuideLLM benchmarks.json: TTFT, e2e, tokens, start and end, the first and last token; no chunks in
  between (no pooled ITL).
Not for reading them (`results.formats`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..runfolder import load_records

FORMATS = ("aiperf", "vllm-bench", "sglang-bench", "guidellm")


def _runs(df: pd.DataFrame) -> list[tuple[tuple[str, int, int], pd.DataFrame]]:
    m = df[~df["warmup"].astype(bool)]
    return [((str(b), int(c), int(r)), g.sort_values("seq")) for (b, c, r), g in
            m.groupby(["bucket", "concurrency", "round"], sort=True)]


def _gaps(t: Any) -> list[float]:
    return np.diff(np.asarray(t, dtype=float)).tolist() if isinstance(t, list) and len(t) > 1 else []


def _f(x: Any) -> float | None:
    return None if x is None or (isinstance(x, float) and np.isnan(x)) else float(x)


def _i(x: Any) -> int | None:
    return None if x is None or (isinstance(x, float) and np.isnan(x)) else int(x)


def to_aiperf(df: pd.DataFrame, out_dir: Path) -> list[Path]:
    files = []
    for n, ((bucket, conc, rnd), g) in enumerate(_runs(df)):
        d = out_dir / f"aiperf-{n:02d}-c{conc}-r{rnd}"
        d.mkdir(parents=True, exist_ok=True)
        with open(d / "profile_export.jsonl", "w") as f:
            for r in g.itertuples():
                md = {"session_num": int(r.seq), "request_start_ns": round(r.start_s * 1e9),
                      "request_end_ns": round(r.end_s * 1e9), "benchmark_phase": "profiling"}
                rec: dict[str, Any] = {"metadata": md, "metrics": {}}
                if r.ok:
                    rec["metrics"] = {
                        "time_to_first_token": {"value": r.ttft_s * 1000, "unit": "ms"},
                        "request_latency": {"value": r.e2e_s * 1000, "unit": "ms"},
                        "inter_chunk_latency": {"value": [x * 1000 for x in _gaps(r.chunk_times_s)], "unit": "ms"},
                        "output_sequence_length": {"value": _i(r.output_tokens), "unit": "tokens"},
                        "usage_completion_tokens": {"value": _i(r.output_tokens), "unit": "tokens"},
                        "usage_prompt_tokens": {"value": _i(r.prompt_tokens), "unit": "tokens"}}
                else:
                    rec["error"] = {"code": None, "type": r.error_kind, "message": r.error_detail or "failed"}
                f.write(json.dumps(rec) + "\n")
        summary = {"aiperf_version": "0.13.0 (exported by servelab)", "input_config": {
            "endpoint": {"streaming": True, "use_server_token_count": True},
            "phases": [{"kind": "profiling", "concurrency": conc}],
            "datasets": [{"prompts": {"isl": {"mean": int(g["target_input_tokens"].iloc[0])},
                                      "osl": {"mean": int(g["target_output_tokens"].iloc[0])}}}]}}
        (d / "profile_export_aiperf.json").write_text(json.dumps(summary))
        files.append(d / "profile_export.jsonl")
    return files


def _bench_lists(g: pd.DataFrame) -> dict[str, Any]:
    ok = g["ok"].astype(bool).tolist()
    return {"ttfts": [_f(t) if o else 0.0 for t, o in zip(g["ttft_s"], ok)],
            "itls": [_gaps(t) if o else [] for t, o in zip(g["chunk_times_s"], ok)],
            "input_lens": [_i(x) for x in g["prompt_tokens"]],
            "output_lens": [_i(x) if o else 0 for x, o in zip(g["output_tokens"], ok)],
            "errors": ["" if o else (e or "failed") for o, e in zip(ok, g["error_detail"])]}


def to_vllm_bench(df: pd.DataFrame, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    files = []
    for n, ((bucket, conc, rnd), g) in enumerate(_runs(df)):
        dur = float(g["end_s"].max() - g["start_s"].min())
        lists = _bench_lists(g)
        res = {"backend": "openai-chat", "endpoint_type": "openai-chat", "model_id": "exported-by-servelab",
               "max_concurrency": conc, "num_prompts": len(g), "request_rate": "inf", "duration": dur,
               "completed": int(g["ok"].sum()), "failed": int((~g["ok"].astype(bool)).sum()),
               **lists, "latencies": [_f(e) if o else 0.0 for e, o in zip(g["e2e_s"], g["ok"])],
               "start_times": g["start_s"].astype(float).tolist(),
               "output_throughput": float(g.loc[g["ok"], "output_tokens"].sum()) / dur if dur > 0 else None}
        p = out_dir / f"vllm-bench-{n:02d}-c{conc}-r{rnd}.json"
        p.write_text(json.dumps(res))
        files.append(p)
    return files


def to_sglang_bench(df: pd.DataFrame, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    p = out_dir / "sglang-bench.jsonl"
    with open(p, "w") as f:
        for (bucket, conc, rnd), g in _runs(df):
            dur = float(g["end_s"].max() - g["start_s"].min())
            res = {"backend": "sglang-oai-chat", "dataset_name": "exported-by-servelab", "request_rate": "inf",
                   "max_concurrency": conc, "duration": dur, "completed": int(g["ok"].sum()),
                   "random_input_len": int(g["target_input_tokens"].iloc[0]),
                   "random_output_len": int(g["target_output_tokens"].iloc[0]), **_bench_lists(g),
                   "output_throughput": float(g.loc[g["ok"], "output_tokens"].sum()) / dur if dur > 0 else None}
            f.write(json.dumps(res) + "\n")
    return [p]


def to_guidellm(df: pd.DataFrame, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    benches = []
    for (bucket, conc, rnd), g in _runs(df):
        ok_reqs, bad = [], []
        for r in g.itertuples():
            t = {"request_start": r.start_s, "request_end": r.end_s,
                 "first_token_iteration": r.start_s + r.ttft_s if r.ok else None,
                 "last_token_iteration": r.start_s + r.chunk_times_s[-1] if r.ok and r.chunk_times_s else None}
            req = {"type_": "generative_request_stats", "info": {"timings": t, "error": None if r.ok else r.error_detail},
                   "request_start_time": r.start_s, "request_end_time": r.end_s,
                   "request_latency": _f(r.e2e_s) if r.ok else None, "prompt_tokens": _i(r.prompt_tokens),
                   "output_tokens": _i(r.output_tokens) if r.ok else None,
                   "time_to_first_token_ms": r.ttft_s * 1000 if r.ok else None}
            (ok_reqs if r.ok else bad).append(req)
        benches.append({"type_": "generative_benchmark",
                        "config": {"strategy": {"type_": "concurrent", "streams": conc}},
                        "requests": {"successful": ok_reqs, "errored": bad, "incomplete": []}})
    p = out_dir / "benchmarks.json"
    p.write_text(json.dumps({"metadata": {"guidellm_version": "0.8.1 (exported by servelab)"}, "benchmarks": benches}))
    return [p]


def export(run_dir: str | Path, fmt: str, out_dir: str | Path) -> list[Path]:
    """The run folder's measured records as `fmt` files under `out_dir`; the files written."""
    df = load_records(Path(run_dir))
    fn = {"aiperf": to_aiperf, "vllm-bench": to_vllm_bench, "sglang-bench": to_sglang_bench,
          "guidellm": to_guidellm}[fmt]
    return fn(df, Path(out_dir))


__all__ = ["FORMATS", "export", "to_aiperf", "to_guidellm", "to_sglang_bench", "to_vllm_bench"]
