"""The trace source: replay a request trace open-loop, each request at its own offset with its
own input and output length. Reads the Azure LLM inference trace CSV (`TIMESTAMP` wall clock,
`ContextTokens`, `GeneratedTokens`) and Mooncake's JSONL (`timestamp` ms from the start,
`input_length`, `output_length`, `hash_ids` of 512-token prefix blocks). Prompt text is built
from the hash ids: block id h is always the same words (seeded by h), so requests that share
ids share a prefix and the server's prefix cache hits where the trace says it did; what no id
covers is unique to the request. A time window, a request cap, and time and length scaling
(for small servers) are applied before replay. Not for writing traces or summarising them
(`analysis.traffic`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from ...paths import resolve
from ...schema import Bucket, TraceSource, Workload
from ..workload import TokenCounter
from .base import Draft, RoundCtx, letter_words


@dataclass
class TraceRow:
    offset_s: float  # from the trace's (or window's) first arrival
    input_tokens: int
    output_tokens: int
    hash_ids: list[int] | None = None
    index: int = 0  # row number in the file (0-based, after sorting by time)


def trace_format(path: str | Path, fmt: str | None = None) -> str:
    if fmt:
        return fmt
    suffix = Path(path).suffix.lower()
    if suffix == ".csv":
        return "azure"
    if suffix in (".jsonl", ".json"):
        return "mooncake"
    raise ValueError(f"{path}: cannot tell the trace format from the extension; set trace.format")


def read_trace(path: str | Path, fmt: str | None = None) -> list[TraceRow]:
    """Every row of a trace file, sorted by arrival, offsets from the first arrival (s).
    Raises ValueError for a file without the format's columns."""
    kind = trace_format(path, fmt)
    path = resolve(path)
    if kind == "azure":
        df = pd.read_csv(path)
        need = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"}
        if not need <= set(df.columns):
            raise ValueError(f"{path}: an Azure trace needs columns {sorted(need)}, found {list(df.columns)}")
        t = pd.to_datetime(df["TIMESTAMP"])
        secs = ((t - t.min()).dt.total_seconds()).tolist()
        rows = [TraceRow(s, int(i), int(o)) for s, i, o in zip(secs, df["ContextTokens"], df["GeneratedTokens"])]
    else:
        rows = []
        for n, line in enumerate(Path(path).read_text().splitlines()):
            if not line.strip():
                continue
            d = json.loads(line)
            try:
                rows.append(TraceRow(float(d["timestamp"]) / 1000.0, int(d["input_length"]), int(d["output_length"]),
                                     [int(h) for h in d.get("hash_ids") or []] or None))
            except KeyError as e:
                raise ValueError(f"{path} line {n + 1}: a Mooncake trace row needs {e}") from None
        t0 = min((r.offset_s for r in rows), default=0.0)
        for r in rows:
            r.offset_s -= t0
    rows.sort(key=lambda r: r.offset_s)
    for i, r in enumerate(rows):
        r.index = i
    return rows


def prepare(rows: list[TraceRow], src: TraceSource) -> list[TraceRow]:
    """The rows a replay sends: windowed, capped, and scaled in time and length."""
    if src.window_s:
        a, b = src.window_s
        rows = [TraceRow(r.offset_s - a, r.input_tokens, r.output_tokens, r.hash_ids, r.index)
                for r in rows if a <= r.offset_s < b]
    if src.max_requests:
        rows = rows[:src.max_requests]
    t0 = rows[0].offset_s if rows else 0.0
    out = []
    for r in rows:
        i = max(1, round(r.input_tokens * src.length_scale))
        o = max(1, round(r.output_tokens * src.length_scale))
        out.append(TraceRow((r.offset_s - t0) * src.time_scale, min(i, src.max_input_tokens or i),
                            min(o, src.max_output_tokens or o), r.hash_ids, r.index))
    return out


def load(src: TraceSource) -> list[TraceRow]:
    return prepare(read_trace(src.path, src.format), src)


def mean_rate_rps(rows: list[TraceRow]) -> float:
    """Arrivals per second over the replay (0 for fewer than two rows)."""
    span = rows[-1].offset_s - rows[0].offset_s if len(rows) > 1 else 0.0
    return (len(rows) - 1) / span if span > 0 else 0.0


class TraceReplay:
    kind = "trace"
    independent = True

    def __init__(self, bucket: Bucket, wl: Workload, counter: TokenCounter) -> None:
        assert bucket.trace is not None
        self.bucket, self.wl, self.src = bucket, wl, bucket.trace
        self.rows = load(self.src)
        if not self.rows:
            raise ValueError(f"trace {self.src.path}: no requests left after window_s / max_requests")
        self.overhead = counter.count("a") - 1
        self.block = max(1, round(self.src.block_tokens * self.src.length_scale))

    def calibration(self) -> dict[str, Any]:
        return {"source": "trace", "path": self.src.path, "format": trace_format(self.src.path, self.src.format),
                "requests": len(self.rows), "span_s": self.rows[-1].offset_s, "time_scale": self.src.time_scale,
                "length_scale": self.src.length_scale, "block_tokens": self.block,
                "template_tokens": self.overhead}

    def prompt(self, row: TraceRow) -> str:
        """About row.input_tokens tokens after the chat template: the row's hash-id blocks
        (equal ids, equal words), then words unique to the row."""
        need = max(1, row.input_tokens - self.overhead)
        parts, have = [], 0
        for h in row.hash_ids or []:
            if have >= need:
                break
            n = min(self.block, need - have)
            parts.append(letter_words(n, f"block-{h}"))
            have += n
        if have < need:
            parts.append(letter_words(need - have, f"row-{row.index}"))
        return " ".join(parts)

    def drafts(self, ctx: RoundCtx) -> list[Draft]:
        salt = f"{ctx.run_token}-L{ctx.level}-r{ctx.round}" if self.wl.cache_salt else None
        return [Draft(max_tokens=r.output_tokens, prompt=self.prompt(r), cache_salt=salt, at_s=r.offset_s,
                      meta={"source": "trace", "trace_index": r.index, "request_input_tokens": r.input_tokens,
                            "request_output_tokens": r.output_tokens, "hash_blocks": len(r.hash_ids or [])})
                for r in self.rows[:ctx.n]]
