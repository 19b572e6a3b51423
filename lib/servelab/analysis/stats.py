"""Small numeric helpers shared by the analyses: NaN-safe numbers, percent change, ordered
unique values, Student-t quantiles (scipy) and the OLS fit of TTFT against prompt length."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from ..summary import measured, one_prompt_length, speed_step, still_warming


def _get(obj: Any, key: str, default: Any = None) -> Any:
    """``obj[key]`` for mappings, ``obj.key`` otherwise (pydantic Slo, dataclasses)."""
    if obj is None:
        return default
    if isinstance(obj, Mapping):
        return obj.get(key, default)
    return getattr(obj, key, default)


def to_float(v: Any) -> float:
    """``float(v)``, NaN when ``v`` is not a number (None, text)."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return math.nan
    return f


def pct_change(new: float, old: float) -> float:
    """Change from ``old`` to ``new`` in percent; NaN when either is not finite or ``old`` is 0."""
    new, old = to_float(new), to_float(old)
    if not (math.isfinite(new) and math.isfinite(old)) or old == 0:
        return math.nan
    return (new - old) / old * 100.0


def ordered_unique(values: Iterable[Any]) -> list[Any]:
    """The distinct values in first-seen order."""
    return list(dict.fromkeys(values))


def _ols(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float, float, float, float]:
    """(intercept, slope, their standard errors, the two-sided 95 % Student t quantile, r²) of
    the least-squares line through at least 2 distinct x; the errors and t are NaN for 2 points."""
    n = len(x)
    xm, ym = float(x.mean()), float(y.mean())
    sxx = float(((x - xm) ** 2).sum())
    b = float(((x - xm) * (y - ym)).sum() / sxx)
    a = ym - b * xm
    rss = float(((y - (a + b * x)) ** 2).sum())
    tss = float(((y - ym) ** 2).sum())
    dof = n - 2
    if dof > 0:
        s2 = rss / dof
        se_b, se_a = math.sqrt(s2 / sxx), math.sqrt(s2 * (1.0 / n + xm**2 / sxx))
        from scipy import stats as _st  # here: scipy.stats takes 0.5 s to import, every servelab command paid it

        t = float(_st.t.ppf(0.975, dof))
    else:
        se_b = se_a = t = math.nan
    return a, b, se_a, se_b, t, (1.0 - rss / tss) if tss > 0 else math.nan


def fit_ttft(prompt_tokens: Sequence[float] | np.ndarray, ttft_s: Sequence[float] | np.ndarray) -> dict[str, Any]:
    """Ordinary least squares of ``ttft_s = overhead_s + slope_s_per_token * prompt_tokens``.

    ``prefill_tps = 1 / slope``. Standard errors are the usual OLS ones
    (``s^2 = RSS / (n - 2)``; ``se(slope) = s / sqrt(Sxx)``;
    ``se(overhead) = s * sqrt(1/n + mean(x)^2 / Sxx)``); ``prefill_tps_se`` uses the
    delta method (``se(slope) / slope^2``) and ``prefill_tps_ci95`` inverts the slope's
    95 % interval (upper end ``inf`` when that interval reaches 0).
    ``slope_significant`` is True when the slope's 95 % interval lies above 0.
    With fewer than 2 distinct prompt lengths nothing is fitted (NaNs and a ``note``);
    with exactly 2 points the fit is exact and the errors are NaN.
    """
    x = np.asarray(prompt_tokens, dtype=float)
    y = np.asarray(ttft_s, dtype=float)
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    n = int(len(x))
    distinct = int(len(np.unique(x)))
    nan2 = (math.nan, math.nan)
    out: dict[str, Any] = {
        "method": "OLS: ttft_s = overhead_s + prompt_tokens / prefill_tps",
        "prefill_tps": math.nan, "prefill_tps_se": math.nan, "prefill_tps_ci95": nan2,
        "overhead_s": math.nan, "overhead_s_se": math.nan, "overhead_s_ci95": nan2,
        "slope_s_per_token": math.nan, "slope_se": math.nan, "slope_significant": False,
        "r2": math.nan, "n": n, "distinct_prompt_lengths": distinct, "note": "",
    }
    if distinct < 2:
        out["note"] = (f"fewer than 2 distinct prompt lengths ({distinct}): the prefill rate is not "
                       "identifiable; measure buckets with different input_tokens at concurrency 1")
        return out
    a, b, se_a, se_b, t, r2 = _ols(x, y)
    notes = [] if n > 2 else ["only 2 points: exact fit, no standard errors"]
    out.update(
        slope_s_per_token=b, slope_se=se_b, overhead_s=a, overhead_s_se=se_a,
        overhead_s_ci95=(a - t * se_a, a + t * se_a), r2=r2,
    )
    if math.isfinite(se_b):
        out["slope_significant"] = bool(b - t * se_b > 0)
    if b > 0:
        out["prefill_tps"] = 1.0 / b
        out["prefill_tps_se"] = se_b / b**2
        lo_b, hi_b = b - t * se_b, b + t * se_b
        out["prefill_tps_ci95"] = (1.0 / hi_b if math.isfinite(hi_b) else math.nan,
                                   (1.0 / lo_b if lo_b > 0 else math.inf) if math.isfinite(lo_b) else math.nan)
    else:
        notes.append("TTFT does not grow with prompt length (slope <= 0): prefill is hidden by other "
                     "costs (queueing, HTTP, first decode step) or the prompts are too short")
    out["note"] = "; ".join(notes)
    return out


def _level_ttfts(records: pd.DataFrame, concurrency: int) -> Iterator[tuple[str, str, list[float], bool]]:
    """(config, bucket, TTFTs in the order they ran, whether its prompts were of one length: `one_prompt_length`) of each
    level at `concurrency`: its successful measured requests (a re-measured level's first pass left out)."""
    if records is None or records.empty or "ttft_s" not in records:
        return
    d = measured(records)
    d = d[(d["concurrency"] == concurrency) & d["ok"].astype(bool) & d["ttft_s"].notna()]
    keys = ["config", "bucket"] + [k for k in ("rate_rps",) if k in d]
    for key, g in d.groupby(keys, sort=False):
        yield (str(key[0]), str(key[1]), [float(x) for x in g.sort_values([k for k in ("round", "seq") if k in g])["ttft_s"]],
               one_prompt_length(g["prompt_tokens"].tolist() if "prompt_tokens" in g else []))


def warming_levels(records: pd.DataFrame, concurrency: int = 1) -> list[dict[str, Any]]:
    """Levels of one prompt length still warming up when measured (`summary.still_warming`) at `concurrency`; their
    medians overstate the warm server. Each: config, bucket, ttft_s in order."""
    return [{"config": c, "bucket": b, "ttft_s": t} for c, b, t, one_length in _level_ttfts(records, concurrency)
            if one_length and still_warming(t)]


def stepped_levels(records: pd.DataFrame, concurrency: int = 1) -> list[dict[str, Any]]:
    """Levels of one prompt length whose speed changed partway through (`summary.speed_step`) at `concurrency`,
    those still warming up left to `warming_levels`: a median across the step is neither speed. Each: config,
    bucket, ttft_s in order, and the medians before and after the step."""
    out = []
    for c, b, t, one_length in _level_ttfts(records, concurrency):
        k = speed_step(t) if one_length else None
        if k is not None and not still_warming(t):
            out.append({"config": c, "bucket": b, "ttft_s": t, "before_s": float(np.median(t[:k])),
                        "after_s": float(np.median(t[k:]))})
    return out


def warming_measured_again(records: pd.DataFrame) -> list[dict[str, Any]]:
    """Levels the runner measured once more because their first pass was still warming up (`measure.runner`: those
    records' `disturbed` says so): config, bucket, the first pass's TTFTs in order and the second's."""
    if records is None or records.empty or "disturbed" not in records or "ttft_s" not in records:
        return []
    first = records["disturbed"].fillna("").astype(str).str.startswith("still warming up")
    kept = measured(records)
    out = []
    for (cfg, bucket), g in records[first].groupby(["config", "bucket"], sort=False):
        again = kept[(kept["config"] == cfg) & (kept["bucket"] == bucket) & (kept["concurrency"] == 1)]
        order = [k for k in ("round", "seq") if k in g]
        out.append({"config": str(cfg), "bucket": str(bucket),
                    "first_ttft_s": [float(x) for x in g.sort_values(order)["ttft_s"]],
                    "ttft_s": [float(x) for x in again.sort_values(order)["ttft_s"]]})
    return out
