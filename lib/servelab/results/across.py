"""Verdicts across runs: two runs of a study (two fresh clones, two days) compared level by level
carry the variance between runs, which neither run can measure alone.

On the log scale of a per-round metric, per level (analysis.verdicts' two-level model, one level up):

    y[run, start, round] = mu[setting] + r[run, setting] + b[start] + beta[round] + e

- sigma_w^2, between rounds of a start: the residuals of the two-way fit (analysis.verdicts);
- sigma_b^2, between engine starts within a run: each run's repeated starts of one setting (its A/A
  repeats), the groups cut at the run's edge, pooled (`analysis.verdicts.between_starts`);
- sigma_r^2, between runs: every setting both runs measured gives, at each level, the difference D
  of its starts' means from one run to the other, whose expectation is 2 sigma_r^2 + sigma_b^2
  (1/m_A + 1/m_B) + what the rounds put into it. The method of moments over those differences (floored
  at 0; one degree of freedom per setting and level) is `run_term`. A day's shift common to every
  setting is in it too: a comparison across runs is not called faster or slower for what every
  setting shared. Without a setting in common (another engine release on both sides) the term is
  given (`--between-run-sd-pct`, measured by repeated runs, e.g. benchmarks/verdict_reruns.py) or
  "not measured", which the page says.

A comparison across runs then carries 2 sigma_r^2 besides the starts' and the rounds' variance: the
between-start estimate handed to `analysis.verdicts.effect_of` is augmented by it (`augmented`),
with Satterthwaite's degrees of freedom. An identical-setting comparison across runs is an A/A pair
(family-wise 5 % over its levels); tests/results/test_across.py simulates its false-positive rate.
Not for comparisons within one run (`analysis.verdicts.verdict_rows`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ..analysis import verdicts


@dataclass(frozen=True)
class RunTerm:
    """The variance of one run's effect on a setting at a level (log scale), and where it came from."""

    var: float | None
    df: float
    source: str  # "runs" (measured from the settings both runs have) | "given" | "not measured"
    settings: tuple[tuple[str, ...], ...] = ()  # the settings both runs measured (their starts)
    pairs: int = 0  # (setting, level) differences it rests on

    @property
    def sd_pct(self) -> float | None:
        return None if self.var is None else math.expm1(math.sqrt(self.var)) * 100.0


def within_run_groups(groups: Sequence[Sequence[str]], run_of: Mapping[str, str]) -> list[tuple[str, ...]]:
    """Each setting's starts cut at the runs' edges: the repeats that measure sigma_b^2 within a run."""
    out = []
    for g in groups:
        for run in dict.fromkeys(run_of[s] for s in g):
            sub = tuple(s for s in g if run_of[s] == run)
            if len(sub) >= 2:
                out.append(sub)
    return list(dict.fromkeys(out))


def run_term(y: pd.DataFrame, groups: Sequence[Sequence[str]], run_of: Mapping[str, str], between: verdicts.Between, *,
             given_sd_pct: float | None = None) -> RunTerm:
    """sigma_r^2 by the method of moments (module docstring) from the settings measured in more than one
    run of `run_of`; `given_sd_pct` (a between-run sd in percent) when no setting is."""
    runs = list(dict.fromkeys(run_of.values()))
    vb = between.var or 0.0
    q = w = 0.0
    n = 0
    shared = []
    for g in dict.fromkeys(tuple(g) for g in groups):
        sides = [[s for s in g if run_of[s] == r] for r in runs[:2]]
        if len(runs) < 2 or not all(sides):
            continue
        shared.append(g)
        for _, lv in y.groupby(verdicts.LEVEL_KEYS, sort=False):
            f = verdicts.fit_level(lv, [*sides[0], *sides[1]])
            if f is None or not math.isfinite(f.sigma_w2):
                continue
            a, b = [s for s in sides[0] if s in f.starts], [s for s in sides[1] if s in f.starts]
            if not a or not b:
                continue
            c = np.array([(1 / len(a) if s in a else 0.0) - (1 / len(b) if s in b else 0.0) for s in f.starts])
            d = float(c @ f.alpha)
            q += d * d
            w += f.sigma_w2 * float(c @ f.cov @ c) + (1 / len(a) + 1 / len(b)) * vb
            n += 1
    if n:
        return RunTerm(max(0.0, (q - w) / (2 * n)), float(n), "runs", tuple(shared), n)
    if given_sd_pct is not None:
        return RunTerm(math.log1p(given_sd_pct / 100.0) ** 2, math.inf, "given")
    return RunTerm(None, math.inf, "not measured")


def _satterthwaite(parts: Sequence[tuple[float, float]]) -> float:
    total = sum(x for x, _ in parts)
    denom = sum(x * x / d for x, d in parts if x > 0 and math.isfinite(d) and d > 0)
    return total * total / denom if denom > 0 and total > 0 else math.inf


def augmented(between: verdicts.Between, term: RunTerm, k: float) -> verdicts.Between:
    """The between-start estimate with the run term added, for a comparison whose two sides lie in
    different runs (`k` = 1/starts + 1/baseline starts): its variance gains 2 sigma_r^2."""
    extra = 2.0 * (term.var or 0.0)
    if extra <= 0:
        return between
    if between.source == "repeats" and between.ms > between.within:
        ms = between.ms + extra / k
        df = _satterthwaite([(k * between.ms, between.df), (extra, term.df)])
        return verdicts.Between(between.var, df, "repeats", between.starts, ms=ms, within=between.within,
                         within_df=between.within_df)
    vb = between.var or 0.0  # given, or repeats whose starts differ no more than rounds explain: 0
    df = _satterthwaite([(k * vb, between.df), (extra, term.df)])
    return verdicts.Between(vb + extra / k, df, "given", between.starts)


def verdict_rows(rounds: pd.DataFrame, cmps: Sequence[verdicts.Comparison], groups: Sequence[Sequence[str]],
                 run_of: Mapping[str, str], *, metrics: Sequence[str] = tuple(verdicts.METRICS),
                 given_sd_pct: float | None = None, given_run_sd_pct: float | None = None,
                 target: float = verdicts.MDE_TARGET) -> tuple[pd.DataFrame, dict[str, verdicts.Between], dict[str, RunTerm]]:
    """`analysis.verdicts.verdict_rows` for starts of several runs (`run_of`: start -> run): sigma_b^2
    from each run's own repeats, sigma_r^2 from the settings the runs share, and every comparison
    whose sides lie in different runs carries the run term."""
    inner = within_run_groups(groups, run_of)
    rows, betweens, terms = [], {}, {}
    for metric in metrics:
        y = verdicts.log_rounds(rounds, metric)
        between = verdicts.between_starts(y, inner, given_sd_pct=given_sd_pct if metric == verdicts.PRIMARY else None)
        term = run_term(y, groups, run_of, between,
                        given_sd_pct=given_run_sd_pct if metric == verdicts.PRIMARY else None)
        betweens[metric], terms[metric] = between, term
        _, direction = verdicts.METRICS[metric]
        levels = list(y.groupby(verdicts.LEVEL_KEYS, sort=False))
        for cmp_ in cmps:
            shared = [k for k, lv in levels if set(cmp_.starts) & set(lv["start"])
                      and set(cmp_.baseline_starts) & set(lv["start"])]
            across = {run_of[s] for s in cmp_.starts} != {run_of[s] for s in cmp_.baseline_starts}
            for key, lv in levels:
                if key not in shared:
                    continue
                alpha = verdicts.ALPHA / len(shared) if cmp_.aa else verdicts.ALPHA
                starts = [*cmp_.starts, *[s for s in cmp_.baseline_starts if s not in cmp_.starts]]
                f = verdicts.fit_level(lv, starts)
                k = 1.0 / len(cmp_.starts) + 1.0 / len(cmp_.baseline_starts)
                b = augmented(between, term, k) if across else between
                e = verdicts.effect_of(f, cmp_.starts, cmp_.baseline_starts, b, direction=direction, alpha=alpha)
                e["rounds_for_target"] = verdicts.rounds_for(e, b, target, cmp_)
                e["more_starts"] = e["rounds_for_target"] == math.inf
                rows.append({"configuration": cmp_.config, "baseline": cmp_.baseline, "level": verdicts.level_label(*key),
                             "bucket": key[0], "concurrency": int(key[1]), "metric": metric, **e, "requests": None,
                             "baseline_requests": None, "aa": cmp_.aa, "between_starts": between.source,
                             "between_runs": term.source if across else None, "settled": verdicts.settled(e, target)})
    return pd.DataFrame(rows, columns=[*verdicts.COLUMNS, "between_runs"]), betweens, terms


def term_json(t: RunTerm) -> dict[str, Any]:
    return {"source": t.source, "sd_pct": t.sd_pct, "df": t.df, "pairs": t.pairs,
            "settings": [list(g) for g in t.settings]}


__all__ = ["RunTerm", "augmented", "run_term", "term_json", "verdict_rows", "within_run_groups"]
