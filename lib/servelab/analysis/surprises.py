"""Surprises and the laws that explain them: which change's measured effect is far outside what its
lever leads one to expect (the levers table: a memory or scheduling lever that costs more than half
the throughput, a speed-up lever that slows down), which configurations of a study sweep one knob,
the law a sweep follows (a least-squares line with its 95 % interval and r², or "does not matter"),
and where it stops costing (the knee: the smallest value within 10 % of the reference).

Pure functions of verdict rows and engine settings; the follow-up runs are ordinary studies
(`cli explain`), the words are `report.why`'s.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from .compare import config_diff
from .stats import _ols
from .verdicts import FASTER, SLOWER

FALL = -0.5  # a no-cost lever that loses more than half its baseline's throughput surprises
KNEE_WITHIN = 0.10  # the knee: the smallest value within 10 % of the reference's throughput


@dataclass(frozen=True)
class Surprise:
    config: str
    baseline: str
    flag: str
    expect: str
    level: str
    effect: float  # relative change of aggregate tok/s
    ci: tuple[float, float]
    rule: str  # "fell_by_half" | "slower_than_baseline"


def changed_flags(engine_params: Mapping[str, Mapping[str, Any]], config: str, baseline: str) -> list[str]:
    """The engine flags (args keys) that differ between a configuration and its baseline."""
    out = []
    for path, _, _ in config_diff(engine_params[baseline], engine_params[config]):
        parts = path.split(".")
        if parts[0] == "args" and len(parts) > 1 and parts[1] not in out:
            out.append(parts[1])
    return out


def detect(rows: pd.DataFrame, engine_params: Mapping[str, Mapping[str, Any]], levers: Any) -> list[Surprise]:
    """Every (change, level) whose verdict on aggregate tok/s is far outside what its lever leads one
    to expect. `rows`: the primary metric's verdict rows without A/A pairs (`report.verdicts.rows`)."""
    out = []
    for r in rows.itertuples():
        if r.configuration not in engine_params or r.baseline not in engine_params:
            continue
        if engine_params[r.configuration].get("kind") != engine_params[r.baseline].get("kind"):
            continue  # an engine against another is no lever
        for flag in changed_flags(engine_params, r.configuration, r.baseline):
            lever = levers.of(flag)
            if lever is None or not isinstance(r.effect, float) or math.isnan(r.effect):
                continue
            ci = tuple(r.ci) if isinstance(r.ci, (list, tuple)) else (math.nan, math.nan)
            if lever.expect == "no_cost" and r.effect <= FALL and r.verdict == SLOWER:
                out.append(Surprise(r.configuration, r.baseline, flag, lever.expect, r.level, r.effect, ci,
                                    "fell_by_half"))
            elif lever.expect == "faster" and r.verdict == SLOWER:
                out.append(Surprise(r.configuration, r.baseline, flag, lever.expect, r.level, r.effect, ci,
                                    "slower_than_baseline"))
    return out


@dataclass
class Sweep:
    """Configurations that differ from one reference in one flag only, at several values."""

    flag: str
    reference: str
    values: dict[str, Any] = field(default_factory=dict)  # config -> its value of the flag (the reference's too)


def sweeps(engine_params: Mapping[str, Mapping[str, Any]], baselines: Mapping[str, str], *,
           reference_value: Mapping[str, Any] | None = None) -> list[Sweep]:
    """Groups of >= 3 configurations (the reference counted) whose only difference from their common
    baseline is one engine flag. `reference_value`: the flag's value where the baseline leaves it
    unset (the engine's default), by flag."""
    groups: dict[tuple[str, str], Sweep] = {}
    for cid, base in baselines.items():
        diff = config_diff(engine_params[base], engine_params[cid])
        if len(diff) != 1 or not diff[0][0].startswith("args."):
            continue
        flag = diff[0][0].split(".", 1)[1]
        sw = groups.setdefault((base, flag), Sweep(flag, base, {base: diff[0][1] if diff[0][1] is not None
                                                               else (reference_value or {}).get(flag)}))
        sw.values[cid] = diff[0][2]
    return [s for s in groups.values() if len(s.values) >= 3]


def fit_law(x: Sequence[float], y: Sequence[float]) -> dict[str, Any]:
    """y = a + b x by least squares: slope, its 95 % interval, r², and `matters` (the slope's
    interval excludes zero). NaNs with fewer than 3 distinct x."""
    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    keep = np.isfinite(xs) & np.isfinite(ys)
    xs, ys = xs[keep], ys[keep]
    nan = {"intercept": math.nan, "slope": math.nan, "slope_ci": [math.nan, math.nan], "r2": math.nan,
           "n": int(len(xs)), "matters": False}
    if len(np.unique(xs)) < 3:
        return nan
    a, b, _, se_b, t, r2 = _ols(xs, ys)
    lo, hi = b - t * se_b, b + t * se_b
    return {"intercept": a, "slope": b, "slope_ci": [lo, hi], "r2": r2, "n": int(len(xs)),
            "matters": bool(lo > 0 or hi < 0)}


def knee(values: Mapping[str, float], effects: Mapping[str, float], within: float = KNEE_WITHIN) -> tuple[str, float] | None:
    """The configuration with the smallest value whose throughput is within `within` of the
    reference's (effect >= -within) and stays so at every larger value; None when no value does."""
    order = sorted((v, c) for c, v in values.items() if isinstance(v, (int, float)) and c in effects)
    best = None
    for v, c in reversed(order):
        if effects[c] >= -within:
            best = (c, float(v))
        else:
            break
    return best


def found(rows: pd.DataFrame, config: str) -> bool:
    """Whether any level found a change for `config` (faster or slower)."""
    return bool(((rows["configuration"] == config) & rows["verdict"].isin([FASTER, SLOWER])).any())


__all__ = ["Surprise", "Sweep", "changed_flags", "detect", "fit_law", "knee", "sweeps", "found"]
