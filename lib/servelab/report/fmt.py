"""How the write-up prints numbers and links: prose numbers with thousands separators, signed
percentages, section anchors and links, the SLO in words, the en-dash note, ranges. Imported by
every report section module; imports none of them."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from ..runfolder import QUALITY_JSON
from . import html
from .load import StudyData


def num(x: Any, nd: int | None = None) -> str:
    """A number for prose: thousands separators; `nd` decimals (default by magnitude)."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return html.MISSING
    if nd is None:
        return html.format_number(x)
    return f"{x:,.{nd}f}"


def minutes(sd: StudyData, seconds: float) -> str:
    """A duration in the study's language: "3 min 41 s" or "41 s"."""
    m, s = int(seconds // 60), round(seconds % 60)
    return sd.w("timing.minutes", m=m, s=s) if m else sd.w("timing.seconds", s=s)


def pct(x: float) -> str:
    return html.MISSING if not math.isfinite(x) else f"{x:+.1f} %"


def anchor(key: str, title: str, level: int = 2) -> str:
    """A heading with a stable anchor (the same in both languages), for the headline's links."""
    return f'<a id="{key}"></a>\n\n{"#" * level} {title}'


def link(sd: StudyData, key: str) -> str:
    return f"([{sd.w('page.see')}: {sd.w('section.' + key)}](#{key}))"


def slo_parts(sd: StudyData) -> str:
    slo = sd.study.slo
    parts = []
    if slo.ttft_p95_s:
        parts.append(f"p95 TTFT ≤ {slo.ttft_p95_s * 1000:,.0f} ms")
    if slo.tpot_p95_s:
        parts.append(f"p95 TPOT ≤ {slo.tpot_p95_s * 1000:,.0f} ms")
    parts.append(f"error rate ≤ {slo.error_rate * 100:.1f} %")
    return ", ".join(parts)


def dash_note(df: pd.DataFrame, text: str) -> dict[str, str] | None:
    """The en-dash footnote, only when a cell of `df` is missing."""
    return {html.MISSING: text} if df.isna().to_numpy().any() or (df == html.MISSING).to_numpy().any() else None


def span(lo: float, hi: float) -> str:
    nd = 0 if min(abs(lo), abs(hi)) >= 100 else 1
    return f"{num(lo, nd)}–{num(hi, nd)}"


# -- a load level in words -------------------------------------------------------------------------

def in_flight(sd: StudyData, n: Any, config: str | None = None, bucket: str | None = None) -> str:
    """"1 request in flight" / "4 requests in flight"; for an open-loop level (the summary's
    rate_rps of that configuration, bucket and concurrency > 0: the concurrency is only the cap on
    requests in flight) "1 req/s offered (open loop)"."""
    rate = _level_rate(sd, config, bucket, n)
    if rate:
        return sd.w("story.offered_rate", rate=f"{rate:g}")
    n = int(n)
    return sd.w("story.in_flight_one") if n == 1 else sd.w("story.in_flight_many", n=n)


def _level_rate(sd: StudyData, config: str | None, bucket: str | None, n: Any) -> float:
    s = sd.summary
    if config is None or s.empty or "rate_rps" not in s:
        return 0.0
    m = s[(s["config"] == config) & (s["concurrency"] == n) & ((s["bucket"] == bucket) if bucket else True)]
    rates = m["rate_rps"].dropna()
    return float(rates.iloc[0]) if len(rates) and float(rates.iloc[0]) > 0 else 0.0


def _open_loop(sd: StudyData, config: str) -> bool:
    s = sd.summary
    return "rate_rps" in s and bool((s.loc[s["config"] == config, "rate_rps"].fillna(0) > 0).all())


def quality(sd: StudyData, cid: str) -> dict[str, Any] | None:
    """The configuration's quality.json (read once), or None when its run folder has none."""
    return sd.file(QUALITY_JSON, cid) if cid in sd.folders else None
