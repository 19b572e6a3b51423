"""The tuning search's judgement, as pure functions: a configuration's objective with its interval
(capacity at SLO: the search's bracket; goodput: the bracket in SLO-meeting output tok/s; c=1
decode: a bootstrap interval on the median), and whether a candidate beats the incumbent beyond
noise (its interval's low end above the incumbent's high end). The quality check, when both runs
have quality.json, flags a candidate whose outputs changed. Not for running anything (`tune`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from . import quality
from .capacity import capacity_result

N_BOOT = 2000


REASON_CHARS = 300  # an engine's start-up error is kept to this many characters


def clip(text: str, n: int = REASON_CHARS) -> str:
    """`text` up to `n` characters, cut at a word and ended with " [cut]" when longer (a reader sees it
    was cut; the page lint reads an ellipsis in a table as a table cut by accident)."""
    return text if len(text) < n else text[:n].rsplit(" ", 1)[0] + " [cut]"


def objective(run: Mapping[str, Any], records: pd.DataFrame, kind: str, seed: int = 0) -> dict[str, Any]:
    """{value, interval: [low, high]} of one run for the objective `kind` (high None = unbounded:
    the search found no failing load)."""
    if kind in ("capacity", "goodput"):
        r = capacity_result(run)
        if not r or r.get("capacity") is None:
            return {"value": 0.0, "interval": [0.0, (r or {}).get("bracket", [None, None])[1] or 0.0]}
        lo, hi = r["bracket"]
        if kind == "goodput":
            per = (r.get("output_tps") or 0.0) / lo if lo else 0.0  # output tokens per request at the capacity
            return {"value": lo * per, "interval": [lo * per, hi * per if hi is not None else None]}
        return {"value": lo, "interval": [lo, hi]}
    if kind == "decode_c1":
        m = records[(~records["warmup"].astype(bool)) & records["ok"].astype(bool)] if not records.empty else records
        if m.empty:
            return {"value": math.nan, "interval": [math.nan, math.nan]}
        m = m[m["concurrency"] == m["concurrency"].min()]
        x = m["decode_tps"].dropna().to_numpy(dtype=float)
        rng = np.random.default_rng(seed)
        boots = np.median(x[rng.integers(0, len(x), (N_BOOT, len(x)))], axis=1)
        lo, hi = (float(v) for v in np.percentile(boots, [2.5, 97.5]))
        return {"value": float(np.median(x)), "interval": [lo, hi]}
    raise ValueError(f"unknown tune objective {kind!r}")


def decide(cand: Mapping[str, Any], inc: Mapping[str, Any]) -> tuple[str, str, float, list[float]]:
    """(verdict kept|rejected, why, gain %, gain interval %) of a candidate against the incumbent.
    Kept only when the candidate's low end is above the incumbent's high end."""
    c_lo, c_hi = cand["interval"]
    i_lo, i_hi = inc["interval"]
    c_hi = math.inf if c_hi is None else c_hi
    i_hi = math.inf if i_hi is None else i_hi
    gain = (cand["value"] - inc["value"]) / inc["value"] * 100.0 if inc["value"] else math.nan
    g_lo = (c_lo - i_hi) / i_hi * 100.0 if i_hi not in (0, math.inf) else math.nan
    g_hi = (c_hi - i_lo) / i_lo * 100.0 if i_lo and c_hi != math.inf else math.nan
    if c_lo > i_hi:
        return "kept", "beats", gain, [g_lo, g_hi]
    if c_hi < i_lo:
        return "rejected", "worse", gain, [g_lo, g_hi]
    return "rejected", "within_noise", gain, [g_lo, g_hi]


def quality_verdict(run_dir: Any, incumbent_dir: Any) -> dict[str, Any] | None:
    """The quality check between a candidate and the incumbent when both have quality.json and
    the check is measurable (`analysis.quality.compare`, the real-model branch); None otherwise."""
    a, b = Path(run_dir) / "quality.json", Path(incumbent_dir) / "quality.json"
    if not (a.exists() and b.exists()):
        return None
    cmp = quality.compare(json.loads(a.read_text()), json.loads(b.read_text()))
    return cmp if cmp.get("measurable") else None
