"""Buckets from observed traffic, each with its approximate input length, expected output length,
arrival pattern and shared prefix. Reads an OpenAI-style request log (JSONL, one request per
line: `messages` or `prompt`, `usage`, a time stamp; the request/response may be nested under
`request`/`response`) or a trace (Azure CSV, Mooncake JSONL) and proposes a `workload:` block:
buckets at input-length quantiles (median input and output of each), arrival rate and burstiness
(Gamma shape fitted by moments), the shared-prefix share per bucket, and the output-length
distribution. Pure functions of the file's text or its trace rows (the caller reads the file:
`servelab workload from-log`); nothing is sent. Not for replaying a trace (`measure.sources.trace`)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import yaml

from ..measure.arrivals import burstiness_of
from ..measure.sources.trace import TraceRow

TIME_KEYS = ("timestamp", "created", "time", "start_time", "arrival_time")


@dataclass
class Observed:
    """One request seen in the log."""

    t_s: float | None
    input_tokens: int
    output_tokens: int
    reused_share: float  # share of the prompt that an earlier request had already sent (prefix)


def _time(v: Any) -> float | None:
    if v is None:
        return None
    if isinstance(v, (int, float)):
        return float(v)
    return pd.Timestamp(v).timestamp()


def _prefix_hashes(messages: list[dict[str, Any]]) -> list[tuple[str, int]]:
    """(hash of messages[:i+1], chars so far) for every message prefix."""
    h, chars, out = hashlib.sha256(), 0, []
    for m in messages:
        c = m.get("content")
        text = c if isinstance(c, str) else json.dumps(c, sort_keys=True)
        h.update(f"{m.get('role')}\x00{text}\x01".encode())
        chars += len(text)
        out.append((h.copy().hexdigest(), chars))
    return out


def trace_kind(suffix: str, text: str) -> str | None:
    """"azure trace" (a .csv) or "mooncake trace" (JSON lines with `hash_ids` or `input_length`) when
    the file with this suffix and text is a trace (`measure.sources.trace.read_trace` reads it);
    None for a request log."""
    if suffix.lower() == ".csv":
        return "azure trace"
    first = next((ln for ln in text.splitlines() if ln.strip()), "")
    return "mooncake trace" if "hash_ids" in first or "input_length" in first else None


def from_trace(rows: list[TraceRow]) -> list[Observed]:
    """The requests of a trace's rows; a request's reused share is its prefix of blocks already seen."""
    seen: set[int] = set()
    out = []
    for r in rows:
        ids = r.hash_ids or []
        hit = 0
        for h in ids:  # a prefix hits while its blocks were seen; the first new block ends it
            if h not in seen:
                break
            hit += 1
        seen.update(ids)
        share = min(1.0, hit * 512 / r.input_tokens) if r.input_tokens else 0.0
        out.append(Observed(r.offset_s, r.input_tokens, r.output_tokens, share))
    return out


def from_log(text: str, name: str) -> list[Observed]:
    """The requests of an OpenAI-style request log's text (JSON lines). Raises ValueError naming
    `name` for a log with no usable request."""
    out, seen_prefix = [], set()
    for line in text.splitlines():
        if not line.strip():
            continue
        d = json.loads(line)
        req, resp = d.get("request") or d, d.get("response") or d
        usage = resp.get("usage") or d.get("usage") or {}
        if "prompt_tokens" not in usage or "completion_tokens" not in usage:
            continue  # a request without usage cannot be sized
        messages = req.get("messages") or ([{"role": "user", "content": req["prompt"]}] if "prompt" in req else [])
        share = 0.0
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        hashes = _prefix_hashes(messages)
        if cached is not None and usage["prompt_tokens"]:
            share = cached / usage["prompt_tokens"]
        elif hashes:
            reused = max((c for h, c in hashes[:-1] if h in seen_prefix), default=0)
            share = reused / hashes[-1][1] if hashes[-1][1] else 0.0
        seen_prefix.update(h for h, _ in hashes)
        t = next((_time(d.get(k) if k in d else req.get(k)) for k in TIME_KEYS if k in d or k in req), None)
        out.append(Observed(t, int(usage["prompt_tokens"]), int(usage["completion_tokens"]), share))
    if not out:
        raise ValueError(f"{name}: no request with usage.prompt_tokens and usage.completion_tokens")
    return out


def _q(v: np.ndarray, q: float) -> int:
    return int(round(float(np.percentile(v, q))))


def propose(obs: list[Observed], n_buckets: int = 3) -> tuple[dict[str, Any], dict[str, Any]]:
    """(workload block, what it was derived from). Buckets split the requests at input-length
    quantiles; each keeps its median input and output length and, when its requests reused
    more than 1 % of their prompts, that share as prefix_reuse."""
    df = pd.DataFrame([o.__dict__ for o in obs])
    n_b = max(1, min(n_buckets, len(df)))
    edges = np.unique(np.percentile(df["input_tokens"], np.linspace(0, 100, n_b + 1)))
    groups = pd.cut(df["input_tokens"], bins=edges, include_lowest=True, duplicates="drop") if len(edges) > 1 \
        else pd.Series(0, index=df.index)
    buckets, facts = [], []
    for i, (_, g) in enumerate(df.groupby(groups, observed=True, sort=True)):
        lo, hi = int(g["input_tokens"].min()), int(g["input_tokens"].max())
        b: dict[str, Any] = {"name": f"log-q{i + 1}-in{lo}-{hi}", "input_tokens": max(1, _q(g["input_tokens"], 50)),
                             "output_tokens": max(1, _q(g["output_tokens"], 50))}
        reuse = float(g["reused_share"].mean())
        if reuse > 0.01:
            b["prefix_reuse"] = round(min(reuse, 0.99), 2)
        buckets.append(b)
        facts.append({"bucket": b["name"], "requests": len(g), "share": round(len(g) / len(df), 3),
                      "input_p10_p50_p90": [_q(g["input_tokens"], q) for q in (10, 50, 90)],
                      "output_p10_p50_p90": [_q(g["output_tokens"], q) for q in (10, 50, 90)],
                      "reused_share": round(reuse, 3)})
    wl: dict[str, Any] = {"api": "chat", "buckets": buckets}
    times = df["t_s"].dropna().to_numpy(dtype=float)
    info: dict[str, Any] = {"requests": len(df), "buckets": facts,
                            "output_p10_p50_p90": [_q(df["output_tokens"], q) for q in (10, 50, 90)],
                            "shared_prefix_share": round(float((df["reused_share"] * df["input_tokens"]).sum()
                                                               / df["input_tokens"].sum()), 3)}
    if len(times) > 2 and times.max() > times.min():
        span = float(times.max() - times.min())
        rate = (len(times) - 1) / span
        shape = burstiness_of(times)
        info.update(span_s=round(span, 3), rate_rps=round(rate, 4), burstiness=round(shape, 3) if shape else None)
        wl.update(arrival="gamma", burstiness=round(shape, 3) if shape else 1.0, rates_rps=[float(f"{rate:.3g}")],
                  duration_s=round(min(span, 120.0), 1), concurrency=[1])
    else:
        wl.update(concurrency=[1, 4, 16])
    return wl, info


def workload_yaml(obs: list[Observed], kind: str, name: str, n_buckets: int = 3) -> str:
    """The proposed `workload:` block as YAML, with what it was derived from (the file `name`, its
    `kind`: `trace_kind`, else "request log") in comments."""
    wl, info = propose(obs, n_buckets)
    head = [f"# workload from {name} ({kind}): {info['requests']} requests",
            f"# output tokens p10/p50/p90: {info['output_p10_p50_p90']}; shared-prefix share of input tokens: "
            f"{info['shared_prefix_share']}"]
    if "rate_rps" in info:
        head.append(f"# arrivals: {info['rate_rps']} req/s over {info['span_s']} s, burstiness (gamma shape) "
                    f"{info['burstiness']}")
    for f in info["buckets"]:
        head.append(f"# {f['bucket']}: {f['requests']} requests ({f['share']:.0%}), input p10/p50/p90 "
                    f"{f['input_p10_p50_p90']}, output {f['output_p10_p50_p90']}, reused {f['reused_share']}")
    return "\n".join(head) + "\n" + yaml.safe_dump({"workload": wl}, sort_keys=False)
