"""Verdicts that reproduce: each change against its baseline, level by level, under a two-level
model of the measurement (Kalibera & Jones, "Rigorous Benchmarking in Reasonable Time", ISMM 2013).

Level 1 is the engine start (expensive, few), level 2 the round of requests within a start
(cheap, many). On the log scale of a per-round metric (aggregate output tok/s; TTFT p50):

    y[start, round] = alpha[start] + beta[round] + e,   e ~ N(0, sigma_w^2)    (within a start)
    alpha[start]    = mu[setting] + b[start],           b ~ N(0, sigma_b^2)    (between starts)

`beta[round]` is the round's block: the same prompts for every start (a prompt set is sent in a
fixed order) and, when the engines are measured interleaved, the same minute of the machine, so
drift and prompt-to-prompt differences cancel between the starts compared. `sigma_w^2` comes from
the residuals of that two-way fit, per comparison and level; `sigma_b^2` from starts that share
every setting (the A/A repeat is one: a second start of the baseline), pooled over levels by the
method of moments, or from the study's `design.between_starts_sd_pct` measured elsewhere on the
host. A change's effect is the difference of its starts' mean from its baseline's starts'; its
variance carries both levels, its degrees of freedom are Satterthwaite's, and its 95 % interval
and minimum detectable effect (MDE: the change the comparison would find with 80 % power) follow.

A verdict is three-valued: `faster` (the interval lies on the better side of zero), `slower`
(the worse side) or `no detectable change` (it straddles zero; the MDE says how small a change
could have been told apart). An A/A pair is one check of the noise model over all its levels, so
its levels share the 5 % (Bonferroni: each level's interval is at 1 - 0.05 / levels). `settled` is the
sequential-sampling rule: the MDE is at most the target. It stops on precision alone, never on the
effect seen so far, so looking again after each round does not inflate the final verdict's
false-positive rate; and every change's verdict comes with an MDE of at most the target wherever
the budget allowed. (It used to stop, too, where an interim 99.9 % interval excluded zero,
Haybittle-Peto: a clear "faster" then kept an MDE of 19 %, and the reader could not tell a verdict
that would reproduce from one that happened to clear zero; a fresh clone, 2026-12-05.)

Not for sending requests (`measure`) nor for prose (`report.progress`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from scipy.special import ndtri, stdtrit

from ..measure.outliers import keep_rounds
from ..schema.runfiles import DesignRecord
from .compare import config_diff

FORMAT_VERSION = 1
ALPHA = 0.05  # two-sided: the verdict's interval is 95 %
POWER = 0.80  # the MDE is the effect found with this probability
MDE_TARGET = 0.10  # default target of the sequential sampling (relative)
#: the sampler stops a comparison at this share of the target: it sees the between-start variance of
#: the levels measured so far, the final verdicts that of every level
SAMPLING_AIM = 0.9
#: ... and once every comparison of a level is there, what is left of the level's share of the budget
#: goes on towards this share of the target: the changes near a verdict's edge (slowdowns of 4-8 %) were
#: told apart by one quiet run and not by the next when each stopped at the aim with a third of its budget
#: left (7:31 and 8:06 against 8:03, 2026-12-05: 9-10 of 12 aggregate verdicts alike). It too looks at the
#: precision only, never at the effect
FINE_AIM = 0.5

#: metric -> (column of the round table, +1 when higher is better, -1 when lower is): the
#: per-request decode speed (1 / a round's mean TPOT between prefills, `summary.decode_tps_steady`), aggregate output tok/s, TTFT p50
METRICS: dict[str, tuple[str, int]] = {"decode_tps_steady": ("decode_tps_steady", 1),
                                       "aggregate_output_tps": ("aggregate_output_tps", 1),
                                       "ttft_p50_s": ("ttft_p50_s", -1)}
PRIMARY = "aggregate_output_tps"
DECODE = "decode_tps_steady"
#: the metrics a comparison must settle before its level stops sampling (`settled`)
SAMPLED = (DECODE, PRIMARY)
FASTER, SLOWER, NO_CHANGE, UNDETERMINED = "faster", "slower", "no detectable change", "not enough rounds"
LEVEL_KEYS = ["bucket", "concurrency"]


def lead_metric(concurrency: Any) -> str:
    """The metric a level's verdict leads with: a single request's decode speed
    at one request in flight, aggregate output tok/s with more."""
    return DECODE if int(concurrency) == 1 else PRIMARY


def level_label(bucket: Any, concurrency: Any) -> str:
    return f"{bucket} c={int(concurrency)}"


# -- which starts share a setting ----------------------------------------------------------------

@dataclass(frozen=True)
class Comparison:
    """One change against its baseline: the starts on each side (a start is one configuration's
    run folder; starts of identical settings pool as one side) and whether it is an A/A."""

    config: str
    baseline: str
    starts: tuple[str, ...]
    baseline_starts: tuple[str, ...]
    aa: bool


def setting_groups(engine_params: Mapping[str, Mapping[str, Any]], workloads: Mapping[str, Any] | None = None
                   ) -> dict[str, tuple[str, ...]]:
    """{config: the configurations, in study order and itself among them, whose engine settings (and
    workload, when given) are identical to its own}: the starts of one setting."""
    ids = list(engine_params)
    out: dict[str, tuple[str, ...]] = {}
    for c in ids:
        same = [o for o in ids if not config_diff(engine_params[c], engine_params[o])
                and (workloads is None or workloads.get(c) == workloads.get(o))]
        out[c] = tuple(same)
    return out


def starts_of(groups: Mapping[str, Sequence[str]], server_of: Mapping[str, str]) -> list[tuple[str, ...]]:
    """The engine starts behind each group of one setting (`setting_groups`): configurations measured on one
    server (`server_of`: the GPU runner's placement, one server per engine) are one start, not repeats of it, so
    each server counts once (its first configuration); a configuration without a server is its own start."""
    out = []
    for g in groups.values():
        seen: dict[str, str] = {}
        for c in g:
            seen.setdefault(server_of.get(c, c), c)
        out.append(tuple(seen.values()))
    return out


def baselines(ids: Sequence[str], named: Mapping[str, str | None], same_model: Callable[[str, str], bool],
              levels: Mapping[str, set[Any]] | None = None) -> dict[str, str]:
    """Each configuration's baseline among `ids` (study order), the one rule while measuring and in the
    report: the one its params name (`baseline:`) when it comes earlier, else the nearest earlier
    configuration that serves the same model and shares a level with it (`levels`: each configuration's
    levels, planned while measuring and measured after; a configuration with its own workload skips
    those it shares none with)."""
    out: dict[str, str] = {}
    for i, c in enumerate(ids):
        if named.get(c) in ids[:i]:
            out[c] = str(named[c])
            continue
        for prev in reversed(ids[:i]):
            if same_model(c, prev) and (levels is None or levels.get(c, set()) & levels.get(prev, set())):
                out[c] = prev
                break
    return out


def comparisons(baselines: Mapping[str, str], groups: Mapping[str, Sequence[str]]) -> list[Comparison]:
    """Every (configuration, baseline) pair as a Comparison. A change pools every start of its own
    setting against every start of its baseline's; an A/A pair (the two share a setting) compares
    the two starts alone. A second start of a change whose pooled comparison is already listed
    (a repeat against a repeat of the baseline) adds no row."""
    out, seen = [], set()
    for cid, base in baselines.items():
        aa = base in groups.get(cid, (cid,))
        if aa:
            starts, bstarts = (cid,), (base,)
        else:
            starts = tuple(groups.get(cid, (cid,)))
            bstarts = tuple(groups.get(base, (base,)))
        key = (frozenset(starts), frozenset(bstarts))
        if key in seen:
            continue
        seen.add(key)
        out.append(Comparison(cid, base, starts, bstarts, aa))
    return out


# -- the two-way fit of one level ------------------------------------------------------------------

@dataclass
class LevelFit:
    """Least squares of y = alpha[start] + beta[round] on one level's rounds (log scale)."""

    starts: list[str]
    alpha: np.ndarray  # per start (identified with the last round's beta fixed at 0)
    cov: np.ndarray  # (X'X)^-1 of the alpha block: Cov(alpha) = sigma_w2 * cov
    sigma_w2: float  # residual variance (NaN without residual degrees of freedom)
    df: int  # residual degrees of freedom
    n: dict[str, int] = field(default_factory=dict)  # rounds per start


def fit_level(y: pd.DataFrame, starts: Sequence[str]) -> LevelFit | None:
    """`y`: rows (start, round, y) of one level. None when none of `starts` has a round."""
    d = y[y["start"].isin(starts)].dropna(subset=["y"])
    starts = [s for s in starts if (d["start"] == s).any()]
    if not starts:
        return None
    si = {s: i for i, s in enumerate(starts)}
    return fit_arrays(np.array([si[s] for s in d["start"]]), d["round"].to_numpy(), d["y"].to_numpy(dtype=float),
                      starts)


def fit_arrays(start_idx: np.ndarray, round_id: np.ndarray, y: np.ndarray, starts: Sequence[str]) -> LevelFit:
    """The two-way fit on arrays: start index (0..J-1) and round id of each observation."""
    J = len(starts)
    rounds, r_idx = np.unique(round_id, return_inverse=True)
    R = len(rounds) - 1  # the last round's block is the reference
    X = np.zeros((len(y), J + R))
    X[np.arange(len(y)), start_idx] = 1.0
    keep = r_idx < R
    X[np.arange(len(y))[keep], J + r_idx[keep]] = 1.0
    u, sv, vt = np.linalg.svd(X, full_matrices=False)  # one decomposition: the fit, (X'X)^+ and the rank
    keep_sv = sv > sv.max() * max(X.shape) * np.finfo(float).eps
    u, sv, vt = u[:, keep_sv], sv[keep_sv], vt[keep_sv]
    coef = vt.T @ ((u.T @ y) / sv)
    xtx_inv = (vt.T / sv**2) @ vt
    resid = y - X @ coef
    df = int(len(y) - len(sv))
    s2 = float(resid @ resid / df) if df > 0 else math.nan
    n = np.bincount(start_idx, minlength=J)
    return LevelFit(list(starts), coef[:J], xtx_inv[:J, :J], s2, df, {s: int(n[i]) for i, s in enumerate(starts)})


def log_rounds(rounds: pd.DataFrame, metric: str) -> pd.DataFrame:
    """The round table (`summary.round_throughput` with `config`) as (start, bucket, concurrency,
    round, y = log(metric)); rounds without a positive value are left out."""
    col, _ = METRICS[metric]
    if rounds.empty or col not in rounds:
        return pd.DataFrame(columns=["start", *LEVEL_KEYS, "round", "y"])
    r = rounds[[c for c in ["config", *LEVEL_KEYS, "round", col] if c in rounds]].copy()
    r = r[pd.to_numeric(r[col], errors="coerce") > 0]
    r["y"] = np.log(r[col].astype(float))
    return r.rename(columns={"config": "start"})[["start", *LEVEL_KEYS, "round", "y"]]


# -- between starts --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Between:
    """The between-start variance of one metric (log scale): measured from repeated starts in the
    study, given by the study (measured elsewhere on the host), or not measured (`var` None).

    From repeats it is the difference of two mean squares, `ms` (of the repeated starts' effects,
    `ms_df` degrees of freedom) minus `within` (what rounds alone put into them, `within_df`):
    a comparison's variance combines them with their signs (Satterthwaite), so a between-start
    variance that one A/A pair estimates poorly is not taken as 0 with many degrees of freedom."""

    var: float | None
    df: float
    source: str  # "repeats" | "given" | "not measured"
    starts: tuple[tuple[str, ...], ...] = ()  # the groups of repeated starts that measured it
    ms: float = 0.0
    within: float = 0.0
    within_df: float = math.inf

    @property
    def sd_pct(self) -> float | None:
        return None if self.var is None else math.expm1(math.sqrt(self.var)) * 100.0


def between_starts(y: pd.DataFrame, groups: Iterable[Sequence[str]], *, given_sd_pct: float | None = None) -> Between:
    """sigma_b^2 by the method of moments over every level and every group of >= 2 starts with one
    setting: for a group's start effects alpha (fitted with the round blocks), the centred sum of
    squares Q has E[Q] = (m - 1) sigma_b^2 + sigma_w^2 tr(C V); the estimate is the pooled excess,
    floored at 0, with sum(m - 1) degrees of freedom. Without repeated starts, `given_sd_pct` (a
    between-start sd in percent measured elsewhere on the host) or "not measured"."""
    reps = tuple(dict.fromkeys(tuple(g) for g in groups if len(g) >= 2))
    fits = [fit_level(lv, g) for _, lv in y.groupby(LEVEL_KEYS, sort=False) for g in reps]
    b = between_from_fits([f for f in fits if f is not None], reps)
    if b.var is None and given_sd_pct is not None:
        return Between(math.log1p(given_sd_pct / 100.0) ** 2, math.inf, "given")
    return b


def between_from_fits(fits: Iterable[LevelFit], reps: tuple[tuple[str, ...], ...] = ()) -> Between:
    """The pooled method-of-moments estimate from two-way fits of repeated starts of one setting
    (each fit: one group at one level). Each level's mean squares are weighted by the inverse of the
    variance they carry, (sigma_b^2 + within_l)^2 / (m - 1), with sigma_b^2 first pooled unweighted:
    a level whose rounds are noisy (the engine's batch forms differently from round to round) says
    little about the variance between starts, and weighted equally its large `within` swallowed what
    the quiet levels showed (three starts 4 % apart at c=1, rounds within 1 %, estimated as 0 and an
    A/A called "faster": a fresh clone, 2026-12-05). Levels of equal noise weigh equally, as before.
    The degrees of freedom are Satterthwaite's over the levels, from the expected mean squares."""
    per = []  # (ms, within, df of ms, df of within) per level and group
    for f in fits:
        if len(f.starts) < 2 or not math.isfinite(f.sigma_w2):
            continue
        m = len(f.starts)
        c = np.eye(m) - np.ones((m, m)) / m
        per.append((float(f.alpha @ c @ f.alpha) / (m - 1), f.sigma_w2 * float(np.trace(c @ f.cov)) / (m - 1),
                    m - 1, f.df))
    if not per:
        return Between(None, math.inf, "not measured")
    ms_l, w_l, d_l, wdf_l = (np.array(x, dtype=float) for x in zip(*per))
    b0 = max(0.0, float((d_l * (ms_l - w_l)).sum() / d_l.sum()))
    w_s = np.sqrt(w_l * w_l.mean())  # shrunk towards the levels' mean: weights follow gross differences, not the noise of w_l
    expected = np.maximum(b0 + w_s, np.finfo(float).tiny)  # E[ms] of each level under the pooled estimate
    g = d_l / expected**2
    g = g / g.sum()
    ms, within = float(g @ ms_l), float(g @ w_l)
    ms_df = float((g @ expected) ** 2 / ((g * expected) ** 2 / d_l).sum())
    wdf = np.where(wdf_l > 0, wdf_l, np.inf)
    within_df = float(within**2 / ((g * w_l) ** 2 / wdf).sum()) if within > 0 else float(wdf_l.sum())
    return Between(max(0.0, ms - within), ms_df, "repeats", reps, ms=ms, within=within, within_df=within_df)


# -- one comparison at one level -------------------------------------------------------------------

def _rel(x: float) -> float:
    """A log-scale difference as a relative change (exp(x) - 1); inf where that overflows (a
    99.9 % interval from two rounds can reach hundreds of standard errors)."""
    return math.expm1(x) if x < 700 else math.inf


def _t(p: float, df: float) -> float:
    """Student t quantile (the normal one for infinite df); scipy.special directly: the
    distribution objects cost ~80 us a call, which the simulation test makes 100,000 of."""
    return float(ndtri(p)) if not math.isfinite(df) else float(stdtrit(max(df, 1.0), p))


def estimate(lv: pd.DataFrame, cmp_: Comparison, between: Between, *, direction: int = 1,
             alpha: float = ALPHA) -> dict[str, Any]:
    """The effect of `cmp_` on one level: relative `effect` (config / baseline - 1), its 95 % `ci`,
    `mde`, `se` and `df` on the log scale, rounds and starts on each side,
    and the three-valued `verdict` (`direction` +1: higher is better; -1: lower is)."""
    starts = [*cmp_.starts, *[s for s in cmp_.baseline_starts if s not in cmp_.starts]]
    return effect_of(fit_level(lv, starts), cmp_.starts, cmp_.baseline_starts, between, direction=direction,
                     alpha=alpha)


def effect_of(f: LevelFit | None, starts: Sequence[str], baseline_starts: Sequence[str], between: Between, *,
              direction: int = 1, alpha: float = ALPHA) -> dict[str, Any]:
    """`estimate` from a fit that holds both sides' starts."""
    ks = [s for s in starts if f is not None and s in f.starts]
    bs = [s for s in baseline_starts if f is not None and s in f.starts]
    out: dict[str, Any] = {"effect": math.nan, "ci": [math.nan, math.nan],
                           "mde": math.nan, "se": math.nan, "df": math.nan, "verdict": UNDETERMINED,
                           "rounds": sum(f.n[s] for s in ks) if f else 0,
                           "baseline_rounds": sum(f.n[s] for s in bs) if f else 0,
                           "starts": len(ks), "baseline_starts": len(bs)}
    if f is None or not ks or not bs or not math.isfinite(f.sigma_w2):
        return out
    c = np.array([(1.0 / len(ks) if s in ks else 0.0) - (1.0 / len(bs) if s in bs else 0.0) for s in f.starts])
    delta = float(c @ f.alpha)
    a = f.sigma_w2 * float(c @ f.cov @ c)  # within starts
    k = 1.0 / len(ks) + 1.0 / len(bs)  # between starts: k * sigma_b^2
    if between.source == "repeats":
        # Kalibera & Jones: the variance of a start's mean comes from the repeated starts (`ms`, few
        # degrees of freedom); rounds only adjust it for this comparison's own numbers of rounds
        # Satterthwaite over the three mean squares with their signs and their own degrees of freedom
        # (the comparison's own rounds carry few when a level got few rounds); where the starts
        # differ no more than rounds explain, the rounds' own variance, trusted no further than the
        # repeated starts that said so (an A/A pair of 2-round starts was called "faster" at +9 %
        # on a se of 0.5 % with the rounds' df alone: a fresh clone, 2026-12-03)
        combined = k * between.ms + a - k * between.within
        if combined > a:
            var = combined
            df = _satterthwaite([(k * between.ms, between.df), (a, f.df), (-k * between.within, between.within_df)])
        else:
            var, df = a, min(float(f.df), between.df)
    else:
        var = a + k * (between.var or 0.0)
        df = _satterthwaite([(a, f.df), (k * (between.var or 0.0), between.df)])
    se = math.sqrt(var)
    t = _t(1 - alpha / 2, df)
    lo, hi = delta - t * se, delta + t * se
    out.update(effect=_rel(delta), ci=[_rel(lo), _rel(hi)],
               mde=_rel((t + _t(POWER, df)) * se), se=se, df=df)
    if se == 0.0 and delta == 0.0:
        out["verdict"] = NO_CHANGE
    elif lo > 0 or hi < 0:
        better = (lo > 0) == (direction > 0)
        out["verdict"] = FASTER if better else SLOWER
    else:
        out["verdict"] = NO_CHANGE
    return out


def _satterthwaite(parts: Sequence[tuple[float, float]]) -> float:
    """Welch-Satterthwaite degrees of freedom of a linear combination of mean squares, each term
    (coefficient x mean square, its df); negative terms count as in Satterthwaite (1946)."""
    total = sum(v for v, _ in parts)
    denom = sum(v * v / d for v, d in parts if v != 0 and math.isfinite(d) and d > 0)
    if total <= 0:
        return math.inf
    return total * total / denom if denom > 0 else math.inf


def rounds_for(row: Mapping[str, Any], between: Between, target: float, cmp_: Comparison) -> float | None:
    """Rounds per start at which this comparison's MDE would reach `target`, extrapolated from its
    variance now (the part rounds can shrink falls as 1 / rounds); inf when the variance between
    starts alone keeps it above the target (more starts, not rounds, would help); None when the
    target is met or nothing was estimated."""
    se, df, mde = row.get("se"), row.get("df"), row.get("mde")
    n = row.get("rounds", 0) / max(row.get("starts", 1), 1)
    if not (isinstance(se, float) and math.isfinite(se) and se > 0 and n > 0) or mde <= target:
        return None
    k = 1.0 / max(row.get("starts", 1), 1) + 1.0 / max(row.get("baseline_starts", 1), 1)
    floor = k * (between.var or 0.0)
    need = (math.log1p(target) / (_t(1 - ALPHA / 2, df) + _t(POWER, df))) ** 2
    if need <= floor:
        return math.inf
    return n * (se * se - floor) / (need - floor)


def plan_for_target(rows: pd.DataFrame, between: Between, *, target: float, launch_s: Mapping[str, float],
                    slot_s: Mapping[str, float], lanes: int = 2, max_starts: int = 12, max_rounds: int = 60
                    ) -> dict[str, Any] | None:
    """The cheapest measurement that would bring every change's MDE (`rows`: one metric, no A/A) to
    `target`: n (>= 2, so the between-start variance is measured) starts of every setting and R
    rounds per start and level. Each row's variance now
    is k0 (s2 / R0 + B) with k0 = 1/starts + 1/baseline_starts, R0 its rounds per start and B the
    between-start variance; with n starts a side it becomes (2 / n)(s2 / R + B), and the MDE is
    (z_0.975 + z_0.8) se (the normal quantiles: more starts bring more degrees of freedom). The
    cost is n starts of each setting (`launch_s`: seconds of one start, two at a time: `lanes`) and
    R rounds at each level of n starts of every setting (`slot_s`: seconds of one start's round at
    that level, measured). None when nothing is estimated; `reached` False when no plan within
    `max_starts` x `max_rounds` does it."""
    r = rows.dropna(subset=["se"])
    r = r[r["se"] > 0]
    if r.empty or not launch_s or not slot_s:
        return None
    b = between.var or 0.0
    z = float(ndtri(1 - ALPHA / 2)) + float(ndtri(POWER))
    need = (math.log1p(target) / z) ** 2
    k0 = 1.0 / r["starts"].clip(lower=1) + 1.0 / r["baseline_starts"].clip(lower=1)
    r0 = (r["rounds"] / r["starts"].clip(lower=1)).clip(lower=1)
    s2 = ((r["se"] ** 2 - k0 * b).clip(lower=0.0) * r0 / k0).to_numpy()
    per_start = sum(launch_s.values()) / max(lanes, 1)  # one start of every setting
    per_round = len(launch_s) * sum(slot_s.values())  # one round of every setting at every level
    best = None
    for n in range(2, max_starts + 1):
        fixed = 2.0 / n
        if fixed * b > need:
            continue
        # the fewest rounds with fixed * (s2 / R + b) <= need for every row
        rounds = max(1, math.ceil(float((fixed * s2 / (need - fixed * b)).max())))
        if rounds > max_rounds:
            continue
        cost = n * per_start + rounds * n * per_round
        if best is None or cost < best["seconds"]:
            best = {"starts": n, "rounds": rounds, "seconds": cost}
    worst = r.loc[r["mde"].idxmax()]
    out = {"target": target, "met": int((r["mde"] <= target).sum()), "rows": int(len(r)),
           "worst": {"configuration": worst["configuration"], "level": worst["level"], "mde": float(worst["mde"])},
           "between_floor_mde": _rel(z * math.sqrt(float(k0.max()) * b)),
           "reached": best is not None, "between_starts": between.source}
    return out | (best or {})


def settled(row: Mapping[str, Any], target: float = MDE_TARGET) -> bool:
    """The sequential rule: a comparison needs no more rounds once its MDE is at most `target`."""
    mde = row.get("mde", math.nan)
    return bool(math.isfinite(mde) and mde <= target)


def open_starts(results: Iterable[tuple[Comparison, Mapping[str, Any]]], target: float = MDE_TARGET) -> set[str]:
    """The starts that still need rounds at a level: both sides of every change not `settled` (its
    result on the primary metric given beside it)."""
    out: set[str] = set()
    for cmp_, r in results:
        # an A/A pair needs no verdict of its own: its starts are the changes' baselines, and they get
        # rounds while a change is open
        if not cmp_.aa and not settled(r, target):
            out.update(cmp_.starts)
            out.update(cmp_.baseline_starts)
    return out


def sampling_rule(cmps: Sequence[Comparison], groups: Mapping[str, Sequence[str]], *, target: float,
                  given_sd_pct: float | None = None, fine: float | None = FINE_AIM
                  ) -> Callable[[int, pd.DataFrame, bool], tuple[set[str], str]]:
    """`measure.interleave.Decide` for these comparisons: after each round of level `li` (its round table
    `rt`), the starts of every comparison whose verdict on per-request decode tok/s or aggregate tok/s is
    not `settled` at `SAMPLING_AIM` of the target; when there are none and `finer` (False past the level's
    share of the budget), those not settled at `fine` of it (the budget, which `measure.interleave` keeps,
    ends those rounds; None: stop at the aim). With the between-start variance from the levels measured so
    far and without the rounds the estimator leaves out (`keep_rounds`)."""
    seen: dict[int, pd.DataFrame] = {}

    def decide(li: int, rt: pd.DataFrame, finer: bool = True) -> tuple[set[str], str]:
        seen[li], _ = keep_rounds(rt)
        results = []
        for metric in SAMPLED:  # a comparison is open while either metric is
            y = log_rounds(pd.concat(list(seen.values()), ignore_index=True), metric)
            between = between_starts(y, groups.values(), given_sd_pct=given_sd_pct if metric == PRIMARY else None)
            lv = log_rounds(seen[li], metric)
            results += [(c, estimate(lv, c, between, direction=METRICS[metric][1])) for c in cmps if not c.aa]
        mdes = [r["mde"] for _, r in results if pd.notna(r["mde"])]
        aim = target * SAMPLING_AIM
        need = open_starts(results, aim)
        if not need and fine is not None and finer:
            aim = target * fine
            need = open_starts(results, aim)
        open_ = sum(not settled(r, aim) for _, r in results)
        note = (f"{open_} of {len(results)} comparisons above {aim * 100:.0f} % (decode and aggregate tok/s), "
                f"largest MDE {max(mdes) * 100:.0f} %" if mdes else "no estimate yet")
        return need, note

    return decide


def plan_from_design(design: DesignRecord, groups: Mapping[str, Sequence[str]], rows: pd.DataFrame, between: Between,
                     target: float) -> dict[str, Any] | None:
    """`plan_for_target` with the costs a study measured (design.json): one start of each setting (the
    mean over its starts) and one start's round at each level; None for a study measured without
    design.json's timings (one at a time, or before it existed)."""
    took = design.launch.per_config_s if design.launch else {}
    levels = [x for x in design.levels if x.rounds and sum(x.rounds.values()) and x.seconds]
    if not took or not levels:
        return None
    settings = list(dict.fromkeys(g for c, g in groups.items() if c in took))  # study order: the same sums
    launch = {g[0]: sum(took[c] for c in g if c in took) / sum(c in took for c in g) for g in settings}
    slot = {x.label: x.seconds / sum(x.rounds.values()) for x in levels}
    r = rows[(rows["metric"] == PRIMARY) & ~rows["aa"].astype(bool)]
    plan = plan_for_target(r, between, target=target, launch_s=launch, slot_s=slot, lanes=int(design.lanes or 1))
    if plan is not None:
        plan["now_seconds"] = (design.launch.wall_s if design.launch else 0.0) + sum(x.seconds for x in levels)
    return plan


# -- every comparison, level and metric --------------------------------------------------------------

def verdict_rows(rounds: pd.DataFrame, cmps: Sequence[Comparison], groups: Iterable[Sequence[str]], *,
                 metrics: Sequence[str] = tuple(METRICS), given_sd_pct: float | None = None,
                 target: float = MDE_TARGET, requests: pd.DataFrame | None = None) -> tuple[pd.DataFrame, dict[str, Between]]:
    """One row per (comparison, level both sides measured, metric), and the between-start estimate
    of each metric. `rounds`: `summary.round_throughput` of every start's records (column
    `config`); `requests`: measured requests per (config, bucket, concurrency) (column `n`)."""
    groups = list(groups)
    rows, betweens = [], {}
    rounds, left_out = keep_rounds(rounds)
    req = ({(r.config, r.bucket, int(r.concurrency)): int(r.n) for r in requests.itertuples()}
           if requests is not None and len(requests) else {})
    for metric in metrics:
        y = log_rounds(rounds, metric)
        between = between_starts(y, groups, given_sd_pct=given_sd_pct if metric == PRIMARY else None)
        betweens[metric] = between
        _, direction = METRICS[metric]
        levels = list(y.groupby(LEVEL_KEYS, sort=False))
        shared = {c: [k for k, lv in levels if set(c.starts) & set(lv["start"]) and set(c.baseline_starts) & set(lv["start"])]
                  for c in cmps}
        for key, lv in levels:
            for cmp_ in cmps:
                if key not in shared[cmp_]:
                    continue
                # an A/A pair checks the noise model once over all its levels: family-wise 5 %
                alpha = ALPHA / len(shared[cmp_]) if cmp_.aa else ALPHA
                e = estimate(lv, cmp_, between, direction=direction, alpha=alpha)
                n_req = sum(req.get((s, key[0], int(key[1])), 0) for s in cmp_.starts)
                n_base = sum(req.get((s, key[0], int(key[1])), 0) for s in cmp_.baseline_starts)
                e["rounds_for_target"] = rounds_for(e, between, target, cmp_)
                e["more_starts"] = e["rounds_for_target"] == math.inf  # JSON has no inf: said apart
                out_ = sum(left_out.get((s, key[0], int(key[1])), 0) for s in {*cmp_.starts, *cmp_.baseline_starts})
                rows.append({"configuration": cmp_.config, "baseline": cmp_.baseline,
                             "level": level_label(*key), "bucket": key[0], "concurrency": int(key[1]),
                             "metric": metric, **e, "requests": n_req, "baseline_requests": n_base,
                             "left_out": out_,
                             "aa": cmp_.aa, "between_starts": between.source,
                             "settled": settled(e, target)})
    return pd.DataFrame(rows, columns=COLUMNS), betweens


COLUMNS = ["configuration", "baseline", "level", "bucket", "concurrency", "metric", "effect", "ci",
           "mde", "se", "df", "rounds_for_target", "verdict", "rounds", "baseline_rounds", "starts", "baseline_starts", "requests",
           "baseline_requests", "left_out", "aa", "between_starts", "settled", "more_starts"]


def to_json(rows: pd.DataFrame, betweens: Mapping[str, Between], *, target: float = MDE_TARGET,
            design: Mapping[str, Any] | None = None, to_target: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """verdicts.json: the model's constants, the between-start estimate per metric, the design the
    study ran with (interleaving, budget), what would reach the MDE target (`plan_for_target`) and
    one row per comparison, level and metric."""
    def clean(v: Any) -> Any:
        if isinstance(v, float):
            return v if math.isfinite(v) else None
        if isinstance(v, (np.floating, np.integer, np.bool_)):
            return clean(v.item())
        if isinstance(v, list):
            return [clean(x) for x in v]
        return v

    return {"format_version": FORMAT_VERSION,
            "model": {"alpha": ALPHA, "power": POWER, "mde_target": target,
                      "scale": "log of the per-round metric; effects relative (config / baseline - 1)"},
            "between_starts": {m: {"var": clean(b.var), "sd_pct": clean(b.sd_pct), "df": clean(float(b.df)),
                                   "source": b.source, "starts": [list(g) for g in b.starts]}
                               for m, b in betweens.items()},
            "design": dict(design or {}),
            "to_target": {k: clean(v) for k, v in to_target.items()} if to_target else None,
            "rows": [{k: clean(v) for k, v in r.items() if k not in ("se", "df", "settled")}
                     | {"se": clean(r["se"]), "df": clean(r["df"])}
                     for r in rows.to_dict("records")]}


def from_json(d: Mapping[str, Any]) -> pd.DataFrame:
    """The rows of a verdicts.json as a frame (None -> NaN)."""
    rows = pd.DataFrame(d.get("rows") or [])
    for c in COLUMNS:
        if c not in rows and c not in ("settled",):
            rows[c] = None
    for c in ("effect", "mde", "se", "df", "rounds_for_target"):
        rows[c] = pd.to_numeric(rows[c], errors="coerce")
    if "more_starts" in rows:  # rounds cannot reach the target, only more starts (inf, written apart)
        rows.loc[rows["more_starts"].eq(True), "rounds_for_target"] = math.inf
    return rows


__all__ = ["Between", "Comparison", "starts_of", "FASTER", "SLOWER", "NO_CHANGE", "UNDETERMINED", "METRICS", "PRIMARY",
           "MDE_TARGET", "DECODE", "SAMPLED", "baselines", "between_starts", "keep_rounds", "lead_metric", "between_from_fits", "comparisons", "effect_of", "estimate", "fit_arrays", "open_starts", "fit_level", "from_json", "level_label",
           "log_rounds", "plan_for_target", "plan_from_design", "sampling_rule", "setting_groups", "settled", "to_json",
           "verdict_rows"]
