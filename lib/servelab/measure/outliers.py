"""Disturbed rounds: a round of one engine start far slower than that start's other rounds at the
same level. Another process taking the CPU, the hypervisor stealing it or a stall of the engine
slows whichever rounds run in that minute; the verdicts must not read such a round as the setting's
speed, and one of them must not widen every interval of the study.

Two rules, one for each line of defence:

- `suspect` (while measuring, `measure.interleave`): a round more than 30 % slower than its start's
  typical round at the level and beyond 4 robust standard deviations of that start's rounds. A
  suspect round is measured again; it counts as disturbed only when the new attempt is not itself
  as slow (a prompt on which a lever does less, e.g. n-gram drafts that miss, repeats; a
  disturbance does not).
- `gross` (the estimator, `analysis.verdicts`): a round more than 2.5x slower than its start's
  typical round (and beyond 4 robust standard deviations) is left out of the fit. Genuine
  round-to-round differences of one start stay below that line (n-gram speculative decoding on the
  rewrite prompts: 1.9x between its best and worst prompt, published local-cpu study of
  2026-12-03); the disturbances seen on 2-vCPU machines were 3-7x (a 26-second burst of another
  process, 2026-12-04). The kept rounds are an ordinary least-squares fit, so the interval, its
  degrees of freedom and the between-start estimate follow as before, from fewer rounds.

"Typical" is the median of the start's fast cluster: its rounds within the rule's factor of its
best round. A disturbance only ever slows a round down, so when two of three rounds of a start are
disturbed, the clean one still sets the reference (a plain median would take a disturbed one).
Not for deciding what to measure (`measure.interleave`) nor for the verdicts themselves.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

SUSPECT_SLOWER = 0.30  # relative: a suspect round is at least this much slower than the start's typical one
GROSS_SLOWER = 1.50  # relative: 2.5x slower (throughput / 2.5, or TTFT x 2.5)
MADS = 4.0  # ... and beyond this many robust standard deviations (1.4826 MAD) of the start's rounds
MAD_TO_SD = 1.4826


def slow_rounds(y: Sequence[float], *, slower: float, direction: int = 1, scale: float | None = None) -> np.ndarray:
    """Which of one start's rounds (log values of a metric at one level; `direction` +1 when higher
    is better) are more than `slower` (relative) slower than the start's typical round and beyond
    `MADS` robust standard deviations (`scale`, log units: given, e.g. pooled over the level's
    starts, or from this start's own fast cluster). Fewer than two finite values: none."""
    v = np.asarray(y, dtype=float) * (1 if direction >= 0 else -1)
    ok = np.isfinite(v)
    out = np.zeros(len(v), dtype=bool)
    if ok.sum() < 2:
        return out
    gap = math.log1p(slower)
    best = float(v[ok].max())
    fast = v[ok][v[ok] >= best - gap]
    ref = float(np.median(fast))
    s = scale if scale is not None else MAD_TO_SD * float(np.median(np.abs(fast - ref)))
    out[ok] = (ref - v[ok]) > max(gap, MADS * s)
    return out


def suspect(y: Sequence[float], direction: int = 1, scale: float | None = None) -> np.ndarray:
    """The runner's rule: rounds to measure again (`SUSPECT_SLOWER`)."""
    return slow_rounds(y, slower=SUSPECT_SLOWER, direction=direction, scale=scale)


def gross(y: Sequence[float], direction: int = 1, scale: float | None = None) -> np.ndarray:
    """The estimator's rule: rounds left out of the fit (`GROSS_SLOWER`)."""
    return slow_rounds(y, slower=GROSS_SLOWER, direction=direction, scale=scale)


def reproduced(flagged: float, again: float, direction: int = 1) -> bool:
    """A suspect round's new attempt (log values) is as slow as the flagged one was (within
    `SUSPECT_SLOWER`): the round is what its prompt does, not a disturbance."""
    d = (again - flagged) * (1 if direction >= 0 else -1)  # > 0: the new attempt is faster
    return d <= math.log1p(SUSPECT_SLOWER)


# -- a study's round table ----------------------------------------------------------------------------

#: the per-round metrics a disturbance shows in (TTFT of tens of milliseconds varies too much by itself)
JUDGED = {"decode_tps_steady": 1, "aggregate_output_tps": 1}


def gross_mask(rounds: pd.DataFrame, keys: Sequence[str] = ("bucket", "concurrency")) -> pd.Series:
    """For `summary.round_throughput` rows (column `config`: the start): True where the round is a
    gross outlier of its start at its level on any judged metric (`gross`)."""
    out = pd.Series(False, index=rounds.index)
    cols = [c for c in JUDGED if c in rounds]
    if rounds.empty or not cols:
        return out
    for _, g in rounds.groupby(["config", *keys], sort=False):
        for c in cols:
            y = np.log(pd.to_numeric(g[c], errors="coerce").where(lambda s: s > 0))
            out.loc[g.index] |= gross(y.to_numpy(), JUDGED[c])
    return out


def keep_rounds(rounds: pd.DataFrame) -> tuple[pd.DataFrame, dict[tuple[str, str, int], int]]:
    """The round table without its gross outliers (`gross`: a round far slower
    than its start's other rounds at the level is left out of every metric's fit), and how many
    rounds each (start, bucket, concurrency) lost."""
    if rounds.empty or "config" not in rounds:
        return rounds, {}
    bad = gross_mask(rounds)
    lost = rounds[bad].groupby(["config", "bucket", "concurrency"]).size()
    return rounds[~bad], {(c, b, int(k)): int(n) for (c, b, k), n in lost.items()}


__all__ = ["GROSS_SLOWER", "JUDGED", "MADS", "SUSPECT_SLOWER", "gross", "gross_mask", "keep_rounds", "reproduced", "slow_rounds", "suspect"]
