"""Where a change matters: each configuration against its baseline, level by level, with the
effect judged against two kinds of noise.

- Round-to-round noise: a bootstrap 95 % interval of the change in median aggregate tok/s over
  the measured rounds of the level (each side's rounds resampled with replacement). With fewer
  than `MIN_ROUNDS` rounds on a side the interval is reported but said to mean little (two
  rounds give at most three distinct medians).
- Run-to-run noise: two server starts of one configuration differ by more than their rounds do
  (the shared machine's load drifts between runs). The study's `run_noise_pct` is that spread as
  measured on the host by an A/A repeat (`run_noise_pct()` of two runs); a change must exceed it
  to be said to matter. Without it, only the round-to-round test applies, and the report says so.

Not for prose (`report.progress`), nor for the whole-study median of `compare.change_effects`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from .stats import pct_change as _pct_change

MIN_ROUNDS = 3  # rounds per side below which a bootstrap interval says little
LEVEL_KEYS = ["bucket", "concurrency"]
COLUMNS = ["config", "baseline", "bucket", "concurrency", "target_input_tokens", "change_pct", "ci_low_pct",
           "ci_high_pct", "rounds", "baseline_rounds", "beyond_rounds", "beyond_run_noise", "matters"]


def _rounds(rounds: pd.DataFrame, config: str, bucket: Any, conc: Any) -> np.ndarray:
    r = rounds[(rounds["config"] == config) & (rounds["bucket"] == bucket) & (rounds["concurrency"] == conc)]
    return r["aggregate_output_tps"].dropna().to_numpy(dtype=float)


def _boot_interval(ra: np.ndarray, rb: np.ndarray, rng: np.random.Generator, n_boot: int) -> tuple[float, float]:
    ma = np.median(ra[rng.integers(0, len(ra), (n_boot, len(ra)))], axis=1)
    mb = np.median(rb[rng.integers(0, len(rb), (n_boot, len(rb)))], axis=1)
    lo, hi = np.percentile((mb - ma) / ma * 100.0, [2.5, 97.5])
    return float(lo), float(hi)


def level_effects(summary: pd.DataFrame, rounds: pd.DataFrame, baselines: Mapping[str, str], *,
                  run_noise_pct: float | None = None, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """One row per (configuration, level both it and its baseline measured).

    `change_pct`: change of median aggregate tok/s, `(config - baseline) / baseline * 100`;
    `ci_low_pct`/`ci_high_pct`: its bootstrap 95 % interval over rounds (fixed `seed`, so a report
    re-renders identically; NaN without rounds); `rounds`/`baseline_rounds`: rounds measured on
    each side; `beyond_rounds`: the interval excludes 0; `beyond_run_noise`: |change| exceeds
    `run_noise_pct` (True when that is None: not measured); `matters`: both.
    `rounds` is `summary.round_throughput(records)`."""
    rng = np.random.default_rng(seed)
    rows = []
    for cur, base in baselines.items():
        a = summary[summary["config"] == base].set_index(LEVEL_KEYS)
        b = summary[summary["config"] == cur].set_index(LEVEL_KEYS)
        for key in [k for k in b.index if k in a.index]:
            ra, rb = _rounds(rounds, base, *key), _rounds(rounds, cur, *key)
            lo, hi = _boot_interval(ra, rb, rng, n_boot) if len(ra) and len(rb) else (math.nan, math.nan)
            change = _pct_change(b.loc[key, "aggregate_output_tps"], a.loc[key, "aggregate_output_tps"])
            beyond_rounds = bool(math.isfinite(lo) and (lo > 0 or hi < 0))
            beyond_run = run_noise_pct is None or (math.isfinite(change) and abs(change) > run_noise_pct)
            rows.append({"config": cur, "baseline": base, "bucket": key[0], "concurrency": int(key[1]),
                         "target_input_tokens": b.loc[key, "target_input_tokens"], "change_pct": change,
                         "ci_low_pct": lo, "ci_high_pct": hi, "rounds": len(rb), "baseline_rounds": len(ra),
                         "beyond_rounds": beyond_rounds, "beyond_run_noise": bool(beyond_run),
                         "matters": beyond_rounds and bool(beyond_run)})
    return pd.DataFrame(rows, columns=COLUMNS)


def few_rounds(effects: pd.DataFrame) -> bool:
    """True when some compared level has fewer than `MIN_ROUNDS` rounds on a side."""
    if effects.empty:
        return False
    return bool((effects[["rounds", "baseline_rounds"]].min(axis=1) < MIN_ROUNDS).any())


def run_noise_pct(rounds_a: pd.DataFrame, rounds_b: pd.DataFrame) -> float:
    """Run-to-run noise from an A/A repeat: the largest |change| of median aggregate tok/s over the
    levels two runs of one configuration share (percent of run A). NaN when they share none."""
    ma = rounds_a.groupby(LEVEL_KEYS)["aggregate_output_tps"].median()
    mb = rounds_b.groupby(LEVEL_KEYS)["aggregate_output_tps"].median()
    shared = ma.index.intersection(mb.index)
    changes = [abs(_pct_change(mb[k], ma[k])) for k in shared]
    changes = [c for c in changes if math.isfinite(c)]
    return max(changes) if changes else math.nan
