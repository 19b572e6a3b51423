"""AIPerf's per-request export (``aiperf profile``, 0.13: ``profile_export.jsonl``) into servelab's
record rows (the columns of the vLLM/GuideLLM/SGLang importers), and its own headline figures
from the summary it writes beside (``profile_export_aiperf.json``).

One JSON line per request: ``metadata`` (``request_start_ns`` and ``request_end_ns`` on the wall
clock, ``benchmark_phase`` warmup | profiling, ``session_num``) and ``metrics``, each
``{"value": ..., "unit": ...}``; an ``error`` object on a failed request. How they map:
- ttft_s = ``time_to_first_token`` (request start -> first response carrying content: servelab's).
- chunk_times_s = ttft + cumulative ``inter_chunk_latency`` (the gaps between content chunks), so
  servelab's pooled ITL is theirs; e2e_s = ``request_latency`` (to the last content chunk: the end
  of the stream, [DONE], is not in the export; servelab's own e2e ends there, < 1 ms later).
- output_tokens = ``output_sequence_length``: the server's usage with ``--use-server-token-count``,
  else AIPerf's tokenizer count of the text (``usage_completion_tokens`` present says which).
- prompt_tokens = ``usage_prompt_tokens`` (server), else ``input_sequence_length`` (their tokenizer).
- start_s / end_s = the wall-clock ns stamps in seconds; the aggregate output tok/s of a round is
  then AIPerf's ``output_token_throughput`` (total output / (last response - first request)).

Record schemas (each told by its own markers, `record_schema`):
- 0.1.x, before aiperf#343 (Oct 2025): metadata ``timestamp_ns`` (request start, wall clock) and
  ``credit_phase``; metric tags ``ttft`` / ``ttst``; the end is the record's
  ``max_response_timestamp`` (start + request latency); the summary holds its metrics under
  ``records`` and states no version.
- 0.2 and later: metadata ``request_start_ns`` / ``request_end_ns`` and ``benchmark_phase``; tags
  ``time_to_first_token`` / ``time_to_second_token``; the summary's metrics at its top level beside
  ``aiperf_version``. Its ``input_config`` is ``endpoint.model_names`` + ``loadgen`` up to 0.8,
  ``models.items`` + ``phases`` + ``datasets`` from 0.13.
Measurement window: the profiling phase (warm-up records are imported, flagged `excluded`). AIPerf's
benchmark duration runs from the first successful request to the last successful response
(``min_request_timestamp`` / ``max_response_timestamp`` are record metrics of successful requests
only); a failed request at either end (a timeout) is outside it.
Not for running AIPerf (benchmarks/tools_study.py does that) or reading its files (`results.formats`)."""

from __future__ import annotations

from typing import Any

import numpy as np

AIPERF = "aiperf"
SUMMARY_NAME = "profile_export_aiperf.json"
#: the short tags of the 0.1.x export -> their names from aiperf#343 on
ALIASES = {"ttft": "time_to_first_token", "ttst": "time_to_second_token"}
OLD, NEW = "0.1.x", "0.2+"


def _v(metrics: dict[str, Any], name: str) -> Any:
    m = metrics.get(name)
    if m is None:
        m = next((x for k, x in metrics.items() if ALIASES.get(k) == name), None)
    return m.get("value") if isinstance(m, dict) else m


def _ms(x: Any) -> float | None:
    return None if x is None else float(x) / 1000.0


def is_record(obj: Any) -> bool:
    """One line of profile_export.jsonl: metadata with a request start stamp and metrics as {value, unit}."""
    return (isinstance(obj, dict) and isinstance(obj.get("metadata"), dict) and isinstance(obj.get("metrics"), dict)
            and ("request_start_ns" in obj["metadata"] or "timestamp_ns" in obj["metadata"]))


def record_schema(obj: dict[str, Any]) -> str:
    """OLD (0.1.x: ``timestamp_ns``, ``credit_phase``) or NEW (``request_start_ns``, ``benchmark_phase``)."""
    return NEW if "request_start_ns" in obj["metadata"] else OLD


def is_summary(obj: Any) -> bool:
    """profile_export_aiperf.json of any version: its input_config beside a version (0.2+) or its metrics
    under ``records`` (0.1.x)."""
    return isinstance(obj, dict) and isinstance(obj.get("input_config"), dict) and (
        "aiperf_version" in obj or isinstance(obj.get("records"), dict))


def summary_metrics(summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The summary's metrics by name (0.1.x: under ``records``, short tags renamed)."""
    src = summary.get("records") if isinstance(summary.get("records"), dict) else summary
    return {ALIASES.get(k, k): m for k, m in src.items() if isinstance(m, dict) and ("avg" in m or "unit" in m)
            and k != "input_config"}


def _phase(md: dict[str, Any]) -> str:
    return str(md.get("benchmark_phase") or md.get("credit_phase") or "profiling")


def _start_ns(md: dict[str, Any]) -> int:
    return md["request_start_ns"] if "request_start_ns" in md else md["timestamp_ns"]


def _end_ns(r: dict[str, Any]) -> int:
    md = r["metadata"]
    if md.get("request_end_ns"):
        return md["request_end_ns"]
    last = _v(r["metrics"], "max_response_timestamp")  # 0.1.x: start + request latency, successful only
    if last:
        return int(last)
    lat = _v(r["metrics"], "request_latency")
    return _start_ns(md) + int(float(lat) * 1e6) if lat is not None else _start_ns(md)


def in_flight_max(starts: list[float], ends: list[float]) -> int:
    """The most requests in flight at once (AIPerf's concurrency when its summary is not at hand)."""
    ev = sorted([(s, 1) for s in starts] + [(e, -1) for e in ends], key=lambda x: (x[0], x[1]))
    n = best = 0
    for _, d in ev:
        n += d
        best = max(best, n)
    return best


def summary_settings(summary: dict[str, Any] | None) -> dict[str, Any]:
    """(concurrency, request rate, target input / output tokens, streaming, server token count, model,
    urls) from a profile_export_aiperf.json's input_config, in its 0.13 layout (phases, datasets,
    models) or the earlier one (loadgen, endpoint.model_names, input.prompt); {} without one."""
    if not summary:
        return {}
    cfg = summary.get("input_config") or {}
    phase = next((p for p in cfg.get("phases") or [] if p.get("kind") == "profiling"), {})
    load = cfg.get("loadgen") or {}
    ds = next(iter(cfg.get("datasets") or []), {})
    prompts = ds.get("prompts") or {}
    old_prompt = (cfg.get("input") or {}).get("prompt") or {}
    ep = cfg.get("endpoint") or {}
    model = next(iter((cfg.get("models") or {}).get("items") or []), {}).get("name") or next(
        iter(ep.get("model_names") or []), None)
    urls = ep.get("urls") or ([ep["url"]] if ep.get("url") else None)
    return {"concurrency": phase.get("concurrency") or load.get("concurrency"),
            "rate_rps": phase.get("rate") or load.get("request_rate"),
            "input_tokens": (prompts.get("isl") or {}).get("mean") or (old_prompt.get("input_tokens") or {}).get("mean"),
            "output_tokens": (prompts.get("osl") or {}).get("mean") or (old_prompt.get("output_tokens") or {}).get("mean"),
            "streaming": ep.get("streaming"), "server_token_count": ep.get("use_server_token_count"),
            "model": model, "urls": urls}


def counted(summary: dict[str, Any] | None) -> int | None:
    """The requests AIPerf counted in its profiling phase (successful + failed), from its summary."""
    m = summary_metrics(summary) if summary else {}
    ok, err = (m.get("request_count") or {}).get("avg"), (m.get("error_request_count") or {}).get("avg")
    return None if ok is None else int(round(ok + (err or 0)))


def aiperf_rows(records: list[dict[str, Any]], *, config: str, summary: dict[str, Any] | None = None,
                bucket_label: str | None = None, round_: int = 0, seq0: int = 0) -> list[dict[str, Any]]:
    """servelab records of one AIPerf run (the lines of its profile_export.jsonl, either schema); a
    warm-up record is kept, flagged `warmup` and `excluded` ("warm-up"), as AIPerf leaves it out."""
    st = summary_settings(summary)
    starts = [_start_ns(r["metadata"]) / 1e9 for r in records]
    ends = [_end_ns(r) / 1e9 for r in records]
    idx = [i for i, r in enumerate(records) if _phase(r["metadata"]) == "profiling"]
    measured = [records[i] for i in idx]
    conc = int(st.get("concurrency") or in_flight_max([starts[i] for i in idx], [ends[i] for i in idx]) or 1)
    outs = [_v(r["metrics"], "output_sequence_length") for r in measured if not r.get("error")]
    ins = [_v(r["metrics"], "usage_prompt_tokens") or _v(r["metrics"], "input_sequence_length")
           for r in measured if not r.get("error")] or [_v(r["metrics"], "error_isl") for r in measured]
    tin = int(st.get("input_tokens") or np.median([x for x in ins if x is not None] or [0]))
    tout = int(st.get("output_tokens") or np.median([x for x in outs if x is not None] or [0]))
    rows = []
    for i, r in enumerate(records):
        m, md = r["metrics"], r["metadata"]
        err = r.get("error")
        ttft = _ms(_v(m, "time_to_first_token"))
        ok = not err and ttft is not None
        gaps = _v(m, "inter_chunk_latency") or []
        chunk_times = (ttft + np.concatenate([[0.0], np.cumsum(np.asarray(gaps, dtype=float) / 1000.0)])).tolist() \
            if ok else []
        e2e = _ms(_v(m, "request_latency")) if ok else None
        out = _v(m, "output_sequence_length") if ok else None
        warm = _phase(md) != "profiling"
        rows.append({
            "config": config, "bucket": bucket_label or f"in{tin}-out{tout}", "target_input_tokens": tin,
            "target_output_tokens": tout, "concurrency": conc, "rate_rps": float(st.get("rate_rps") or 0.0),
            "round": round_, "warmup": warm, "excluded": "warm-up" if warm else None, "seq": seq0 + i,
            "ok": ok, "error_kind": None if ok else "peer_error",
            "error_detail": None if ok else str((err or {}).get("message") or "no content response")[:600],
            "ttft_s": ttft if ok else None, "e2e_s": e2e,
            "prompt_tokens": _v(m, "usage_prompt_tokens") or _v(m, "input_sequence_length") or _v(m, "error_isl"),
            "output_tokens": int(out) if out is not None else None,
            "reasoning_tokens": _v(m, "reasoning_token_count") if ok else None,
            "decode_tps": None, "e2e_output_tps": None, "tpot_s": None,  # recomputed by analysis.harmonise
            "chunk_times_s": chunk_times, "start_s": starts[i], "end_s": ends[i], "tool": AIPERF,
            "times_reconstructed": False,
            "output_tokens_source": "server" if _v(m, "usage_completion_tokens") is not None else "tool tokenizer",
        })
    return rows


def aiperf_reported(summary: dict[str, Any]) -> dict[str, Any]:
    """AIPerf's own figures from profile_export_aiperf.json, in servelab's units (s, tok/s), under
    the names the definitions table uses (`<metric>.<stat>`)."""
    out: dict[str, Any] = {}
    metrics = summary_metrics(summary)
    for name, scale in (("time_to_first_token", 1e-3), ("request_latency", 1e-3), ("inter_token_latency", 1e-3),
                        ("inter_chunk_latency", 1e-3), ("output_token_throughput_per_user", 1.0),
                        ("output_sequence_length", 1.0), ("output_token_throughput", 1.0),
                        ("e2e_output_token_throughput", 1.0), ("request_count", 1.0), ("request_error_rate", 1.0)):
        m = metrics.get(name)
        if not isinstance(m, dict):
            continue
        for stat in ("avg", "p50", "p95"):
            if m.get(stat) is not None:
                out[f"{name}.{stat}"] = float(m[stat]) * scale
    return out


__all__ = ["AIPERF", "ALIASES", "NEW", "OLD", "SUMMARY_NAME", "aiperf_reported", "aiperf_rows", "counted",
           "in_flight_max", "is_record", "is_summary", "record_schema", "summary_metrics",
           "summary_settings"]
