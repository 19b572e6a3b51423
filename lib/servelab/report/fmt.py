"""How the write-up prints numbers and links: prose numbers with thousands separators, signed
percentages, section anchors and links, the SLO in words, the en-dash note, ranges. Imported by
every report section module; imports none of them."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from . import html as rh
from .load import StudyData


def num(x: Any, nd: int | None = None) -> str:
    """A number for prose: thousands separators; `nd` decimals (default by magnitude)."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return rh.MISSING
    if nd is None:
        return rh.format_number(x)
    return f"{x:,.{nd}f}"


def minutes(sd: StudyData, seconds: float) -> str:
    """A duration in the study's language: "3 min 41 s" or "41 s"."""
    m, s = int(seconds // 60), round(seconds % 60)
    return sd.w("timing.minutes", m=m, s=s) if m else sd.w("timing.seconds", s=s)


def pct(x: float) -> str:
    return rh.MISSING if not math.isfinite(x) else f"{x:+.1f} %"


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
    return {rh.MISSING: text} if df.isna().to_numpy().any() or (df == rh.MISSING).to_numpy().any() else None


def span(lo: float, hi: float) -> str:
    nd = 0 if min(abs(lo), abs(hi)) >= 100 else 1
    return f"{num(lo, nd)}–{num(hi, nd)}"
