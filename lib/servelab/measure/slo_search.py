"""The capacity-at-SLO search as pure functions: verdicts of trials and loads, the bracket, the
next load to run, the stop rule and the worst-case cost.

A trial is one ordinary load level (an open-loop request rate, or a closed-loop concurrency)
whose measured requests give a p95 TTFT, a p95 TPOT and an error rate. A load passes when every
SLO term it has is met. A p95 from n requests has a distribution-free interval from its order
statistics (the binomial count of requests under the true p95; MLPerf LoadGen's early-stopping
estimate is the same bound): a load's verdict is *decided* only when every term's one-sided 95 %
bound is on one side of its target (all upper bounds under: pass; a lower bound over: fail);
passing a p95 target needs at least 59 requests under it. Trials pooled at one load are clusters:
where they differ beyond what independent requests explain (a slow minute of the machine), the
bound counts fewer requests (`design_effect`), and once the search has repeated trials anywhere,
the trials' own p95s with their spread over the search (`trial_spread`) widen every load's bound
(trials as the unit: a trial that happens to agree with its repeat is no proof). The search is monotone: the first trial
is repeated at once (a cold first trial is an outlier to drop, not a verdict), then it doubles the
load until a trial fails (bracket) and bisects; at the bracket's ends it extends the trials (more
requests, pooled) until the verdict there is decided. It stops when the bracket is narrower than
`precision` of its lower end and both ends are decided (or undecided after `max_repeats` trials:
said so, with the number of requests), or when its trial count is spent. A load still undecided
after `max_repeats` trials is *at the target* within its interval: it bounds nothing, the bracket's
ends are the decided loads around it, and the result lists it. Beside the bracket, the result reads
the capacity off every trial near it at once (`fitted`: a line of log p95 against log load, where it
crosses the target, with its bounds). Everything is a function of the trials so far, so a resumed search
replays the same decisions. No I/O: the driver (`measure.capacity`) runs the trials; the
report (`analysis.capacity`) reads them back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

from .slo_stats import ALPHA, binom_cdf, binom_sf, crossing, design_effect, quantile_bounds, t95  # noqa: F401 (re-exported)

# the SLO's percentile: p95 over the target <=> more than 5 % of requests over it
SLO_QUANTILE = 0.95

TERMS = ("ttft_p95_s", "tpot_p95_s", "error_rate")
OUTLIER_MIN_DIFF = 0.10  # the first trial's median must differ from its repeat's by more than this share
SPREAD_MIN_REQUESTS = 20  # a trial's own p95 counts towards the trial-to-trial spread from this many requests


@dataclass(frozen=True)
class Targets:
    """The SLO a load must meet (None = term not set)."""

    ttft_p95_s: float | None = None
    tpot_p95_s: float | None = None
    error_rate: float = 0.01

    @classmethod
    def of(cls, slo: Any) -> "Targets":
        return cls(slo.ttft_p95_s, slo.tpot_p95_s, slo.error_rate)

    def terms(self) -> dict[str, float]:
        return {k: v for k, v in (("ttft_p95_s", self.ttft_p95_s), ("tpot_p95_s", self.tpot_p95_s),
                                  ("error_rate", self.error_rate)) if v is not None}


@dataclass
class Trial:
    """One measured level: its load and its requests' latencies (ok requests) and outcome."""

    level: int
    load: float
    ttft_s: list[float]
    tpot_s: list[float]
    sent: int
    failed: int
    output_tps: float = float("nan")  # aggregate output tok/s of the level
    request_rps: float = float("nan")  # achieved completed requests per second
    in_flight: float = float("nan")  # mean concurrent requests (Little's law)


def _p95(xs: list[float]) -> float:
    xs = sorted(x for x in xs if x == x)
    if not xs:
        return float("nan")
    return float(np.percentile(xs, SLO_QUANTILE * 100))


def measured(ttft_s: list[float], tpot_s: list[float], sent: int, failed: int) -> dict[str, float]:
    """The three SLO quantities of a set of requests."""
    return {"ttft_p95_s": _p95(ttft_s), "tpot_p95_s": _p95(tpot_s),
            "error_rate": failed / sent if sent else float("nan")}


def term_passes(term: str, value: float, target: float) -> bool:
    return value == value and value <= target


def point_verdict(m: dict[str, float], t: Targets) -> bool:
    """Pass when every set term is met (a NaN measurement fails: nothing came back)."""
    return all(term_passes(k, m[k], v) for k, v in t.terms().items())


def binding(m: dict[str, float], t: Targets) -> str | None:
    """The term furthest over its target (ratio), or None when all are met."""
    over = {k: m[k] / v if v else math.inf for k, v in t.terms().items() if not term_passes(k, m[k], v)}
    return max(over, key=lambda k: (over[k] if over[k] == over[k] else math.inf)) if over else None


def _trial_q(tr: Trial, term: str) -> float | None:
    """log of a trial's own p95 of `term`, when it has enough requests and none failed."""
    xs = [x for x in (tr.ttft_s if term == "ttft_p95_s" else tr.tpot_s) if x == x]
    p = _p95(xs) if len(xs) >= SPREAD_MIN_REQUESTS and not tr.failed else 0.0
    return math.log(p) if p > 0 else None


def trial_spread(by_load: dict[float, list[Trial]], term: str) -> tuple[float, int] | None:
    """(sd, df) of the log of each trial's own p95, pooled within loads over every load with two or
    more trials of `SPREAD_MIN_REQUESTS` requests; None before there are two. On the 2-vCPU machine
    a trial's p95 TPOT moved by 13 % (42 df) between trials at one load of one search, while each
    trial's order-statistic interval was 1-2 % wide (docs/capacity.md)."""
    ss, df = 0.0, 0
    for trials in by_load.values():
        qs = [q for q in (_trial_q(tr, term) for tr in trials) if q is not None]
        if len(qs) >= 2:
            m = sum(qs) / len(qs)
            ss += sum((q - m) ** 2 for q in qs)
            df += len(qs) - 1
    return (math.sqrt(ss / df), df) if df else None


def term_interval(trials: list[Trial], term: str, target: float,
                  spread: tuple[float, int] | None = None) -> dict[str, Any]:
    """One SLO term pooled over a load's trials: the point value, its one-sided 95 % bounds (the
    requests' effective number shrunk by the trials' design effect, `deff`), the requests behind it,
    and `decided`: "pass" (upper bound <= target), "fail" (lower bound > target) or None (the
    interval straddles the target)."""
    failed = sum(tr.failed for tr in trials)
    if term == "error_rate":
        # a count, judged as measured: at or under the allowed share passes (0 failures in 60 could
        # not bound a 1 % rate: that would take 299 requests); over it fails once an exact
        # binomial test puts the share beyond the allowed one, else it is undecided
        n = sum(tr.sent for tr in trials)
        value = failed / n if n else math.nan
        dec = None
        if n and value <= target:
            dec = "pass"
        elif n and binom_sf(failed - 1, n, target) < ALPHA:
            dec = "fail"
        return {"value": value, "lower": math.nan, "upper": math.nan, "n": n, "decided": dec}
    per = [(tr.ttft_s if term == "ttft_p95_s" else tr.tpot_s, tr.failed) for tr in trials]
    values = [x for xs, _ in per for x in xs]
    deff = design_effect(per, target)
    lo, hi = quantile_bounds(values, failed, SLO_QUANTILE, deff=deff)
    out = {"value": _p95(values), "lower": lo, "upper": hi, "n": len(values) + failed, "deff": deff}
    qs = [q for q in (_trial_q(tr, term) for tr in trials) if q is not None]
    if spread is not None and qs:
        # the trials as the unit: the mean of their log p95 +- t * spread / sqrt(trials); the bound
        # is the wider of this and the requests' own, so neither kind of noise is left out
        m, half = sum(qs) / len(qs), t95(spread[1]) * spread[0] / math.sqrt(len(qs))
        out.update(lower=min(lo, math.exp(m - half)), upper=max(hi, math.exp(m + half)),
                   trial_sd=spread[0], trial_df=spread[1])
    out["decided"] = "pass" if out["upper"] <= target else "fail" if out["lower"] > target else None
    return out


def _decide(out: list[str | None]) -> str | None:
    return "fail" if "fail" in out else "pass" if out and all(x == "pass" for x in out) else None


@dataclass
class LoadVerdict:
    load: float
    trials: list[Trial]
    passes: bool  # pooled point verdict
    settled: bool  # decided: every term's 95 % bound on one side of its target
    how: str  # "interval" | "undecided" | "too few trials"
    measured: dict[str, float]
    binding: str | None
    terms: dict[str, dict[str, Any]] = field(default_factory=dict)  # term -> term_interval

    @property
    def requests(self) -> int:
        return sum(tr.sent for tr in self.trials)

    def to_dict(self) -> dict[str, Any]:
        return {"load": self.load, "trials": [tr.level for tr in self.trials], "passes": self.passes,
                "settled": self.settled, "how": self.how, "measured": self.measured, "binding": self.binding,
                "requests": self.requests, "terms": {k: _finite(v) for k, v in self.terms.items()}}


def _finite(d: dict[str, Any]) -> dict[str, Any]:
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}


def load_verdict(trials: list[Trial], t: Targets, repeats: int = 1, spreads: dict[str, Any] | None = None) -> LoadVerdict:
    """A load's pooled verdict: decided when the interval says so and `repeats` trials at least
    ran there (a point verdict the interval cannot back is never called settled). `spreads`: the
    search's trial-to-trial spread per term (`trial_spread`), which widens the interval."""
    m = measured([x for tr in trials for x in tr.ttft_s], [x for tr in trials for x in tr.tpot_s],
                 sum(tr.sent for tr in trials), sum(tr.failed for tr in trials))
    passes = point_verdict(m, t)
    terms = {k: term_interval(trials, k, v, (spreads or {}).get(k)) for k, v in t.terms().items()}
    iv = _decide([x["decided"] for x in terms.values()])
    if iv is not None and (iv == "pass") == passes and len(trials) >= repeats:
        settled, how = True, "interval"
    else:
        settled, how = False, "too few trials" if iv is not None else "undecided"
    return LoadVerdict(trials[0].load, trials, passes, settled, how, m, binding(m, t), terms)


def first_outlier(trials: list[Trial]) -> dict[str, Any] | None:
    """The first trial against its immediate repeat (the same load): an outlier when, for TTFT or
    TPOT, their two-sided 95 % intervals of the median do not overlap (a p95 from a dozen requests
    has no upper bound to compare; the median has a tight one). None when they agree (or the search
    has no repeat of its first trial yet)."""
    if len(trials) < 2 or trials[1].load != trials[0].load:
        return None
    a, b = trials[0], trials[1]
    for name, xa, xb in (("ttft_s", a.ttft_s, b.ttft_s), ("tpot_s", a.tpot_s, b.tpot_s)):
        if not xa or not xb:
            continue
        la, ha = quantile_bounds(xa, a.failed, 0.5, ALPHA / 2)
        lb, hb = quantile_bounds(xb, b.failed, 0.5, ALPHA / 2)
        ma, mb = float(np.median(xa)), float(np.median(xb))
        # beyond noise (the intervals apart) and beyond a noise threshold (criterion.rs's idea):
        # a near-deterministic server's first requests may differ by a millisecond, which is no outlier
        if (la > hb or lb > ha) and abs(ma - mb) > OUTLIER_MIN_DIFF * min(ma, mb):
            return {"term": name, "first_median": ma, "repeat_median": mb, "first_interval": [la, ha],
                    "repeat_interval": [lb, hb]}
    return None


@dataclass(frozen=True)
class SearchSpec:
    """How the search runs (the `capacity:` block, or `servelab capacity`'s options)."""

    axis: str = "rate"  # "rate" (req/s, open loop) or "concurrency" (closed loop)
    start: float = 1.0
    min_load: float = 0.125
    max_load: float = 256.0
    growth: float = 2.0
    precision: float = 0.1  # stop when (hi - lo) / lo <= this
    repeats: int = 2  # trials at least at each end of the bracket (their pooled interval decides)
    max_repeats: int = 4  # at most this many trials pooled at one load (a p95 pass needs >= 59 requests)
    max_trials: int = 24

    def snap(self, x: float) -> float:
        """Loads are round numbers: integers for concurrency, 3 significant digits for rates."""
        if self.axis == "concurrency":
            return float(max(1, round(x)))
        if x <= 0:
            return x
        return float(f"{x:.3g}")

    def narrow(self, lo: float, hi: float) -> bool:
        if self.axis == "concurrency" and hi - lo <= 1:
            return True
        return (hi - lo) / lo <= self.precision

    def worst_case_trials(self) -> int:
        """The first trial and its repeat, bracket doublings from start to the far end, bisection
        to `precision`, and the extensions at both ends; never more than max_trials."""
        g = math.log(self.growth)
        up = math.ceil(math.log(self.max_load / self.start) / g) if self.max_load > self.start else 0
        down = math.ceil(math.log(self.start / self.min_load) / g) if self.start > self.min_load else 0
        bisect = math.ceil(math.log2((self.growth - 1) / self.precision)) if self.precision < self.growth - 1 else 0
        return min(self.max_trials, 2 + max(up, down) + bisect + 2 * (self.max_repeats - 1))


@dataclass
class SearchState:
    verdicts: list[LoadVerdict]  # by load, ascending
    lo: LoadVerdict | None  # highest passing load below every failing one
    hi: LoadVerdict | None  # lowest failing load above lo
    next_load: float | None
    reason: str  # why it stopped, or what the next trial is for
    non_monotone: list[float] = field(default_factory=list)  # passing loads above a failing one
    outlier: dict[str, Any] | None = None  # the first trial, when its repeat says it was an outlier
    at: list[LoadVerdict] = field(default_factory=list)  # loads undecided after max_repeats trials

    @property
    def done(self) -> bool:
        return self.next_load is None


def at_target(v: LoadVerdict, spec: SearchSpec) -> bool:
    """A load whose pooled interval still straddles the target after `max_repeats` trials."""
    return not v.settled and v.how == "undecided" and len(v.trials) >= spec.max_repeats


def group(trials: Iterable[Trial]) -> dict[float, list[Trial]]:
    out: dict[float, list[Trial]] = {}
    for tr in trials:
        out.setdefault(tr.load, []).append(tr)
    return dict(sorted(out.items()))


def state(trials: list[Trial], t: Targets, spec: SearchSpec) -> SearchState:
    """Where the search stands after `trials`, and the next load to run (None = stop). The first
    trial is repeated before anything else; when the repeat says it was an outlier, it is left out
    of every verdict (it stays in the run folder)."""
    st = _bracket(trials, t, spec)
    if len(trials) >= spec.max_trials:
        st.reason = f"trial budget spent ({spec.max_trials} trials)"
        return st
    if not trials:
        st.next_load, st.reason = spec.snap(spec.start), "first trial"
        return st
    if len(trials) == 1:
        st.next_load, st.reason = trials[0].load, "repeat the first trial: was the warmed server steady?"
        return st
    return _next_load(st, spec)


def _bracket(trials: list[Trial], t: Targets, spec: SearchSpec) -> SearchState:
    """Each load's verdict and the bracket they make (no next load yet)."""
    outlier = first_outlier(trials)
    usable = trials[1:] if outlier else trials
    by_load = group(usable)
    spreads = {k: trial_spread(by_load, k) for k in t.terms() if k != "error_rate"}
    vs = [load_verdict(trs, t, spec.repeats, spreads) for trs in by_load.values()]
    # a load still undecided after max_repeats trials sits at the target within what its requests
    # can tell: it bounds nothing, and the bracket's ends are the decided (or still open) loads
    # around it, so the same server gives the same bracket however its noise falls at the target
    at = [v for v in vs if at_target(v, spec)]
    rest = [v for v in vs if not at_target(v, spec)]
    fails = [v for v in rest if not v.passes]
    hi = fails[0] if fails else None
    below = [v for v in rest if v.passes and (hi is None or v.load < hi.load)]
    lo = below[-1] if below else None
    odd = [v.load for v in rest if v.passes and hi is not None and v.load > hi.load]
    return SearchState(vs, lo, hi, None, "", odd, outlier, at)


def _next_load(st: SearchState, spec: SearchSpec) -> SearchState:
    """`st` with the next load to run and why, or the reason the search stops (next_load None)."""
    lo, hi, at = st.lo, st.hi, st.at
    tried_at = {v.load for v in at}

    def step(x: float, factor: float) -> float:  # the next load that way, past loads already at the target
        x = spec.snap(min(max(x * factor, spec.min_load), spec.max_load))
        while x in tried_at and spec.min_load < x < spec.max_load:
            x = spec.snap(min(max(x * factor, spec.min_load), spec.max_load))
        return x

    if hi is None and lo is None:  # every load so far at the target: find a decided pass below
        low = min(tried_at)
        if low <= spec.min_load:
            st.reason = f"even the lowest load searched ({spec.min_load:g}) is at the target within its interval"
            return st
        st.next_load, st.reason = step(low, 1 / spec.growth), "bracket: lower the load (the loads so far are at the target)"
        return st
    if hi is None:
        nxt = step(lo.load, spec.growth)
        if lo.load >= spec.max_load or nxt in tried_at:
            return _settle_or(st, spec, lo, None, f"capacity is at least the highest load searched ({spec.max_load:g})")
        st.next_load, st.reason = nxt, "bracket: raise the load"
        return st
    if lo is None:
        nxt = step(hi.load, 1 / spec.growth)
        if hi.load <= spec.min_load or nxt in tried_at:
            st.reason = f"even the lowest load searched ({spec.min_load:g}) misses the SLO"
            return st
        st.next_load, st.reason = nxt, "bracket: lower the load"
        return st
    if not spec.narrow(lo.load, hi.load):
        mid = spec.snap((lo.load + hi.load) / 2)
        if lo.load < mid < hi.load and all(v.load != mid for v in at):
            st.next_load, st.reason = mid, "bisect"
            return st
    inside = [v for v in at if lo.load < v.load < hi.load]
    done = ("bracket narrow and both ends decided at 95 % confidence" if not inside else
            "both ends decided at 95 % confidence; between them " + ", ".join(
                f"{v.load:g} is at the target within its interval ({v.requests} requests)" for v in inside))
    return _settle_or(st, spec, lo, hi, done)


def _settle_or(st: SearchState, spec: SearchSpec, lo: LoadVerdict, hi: LoadVerdict | None, done: str) -> SearchState:
    for end in (lo, hi):
        if end is not None and not end.settled and len(end.trials) < spec.max_repeats:
            st.next_load, st.reason = end.load, "more requests at the bracket's end: its interval straddles the target"
            return st
    if all(e is None or e.settled for e in (lo, hi)):
        st.reason = done
    else:
        open_ = [e for e in (lo, hi) if e is not None and not e.settled]
        st.reason = done.split(" and ")[0] + "; " + ", ".join(
            f"{e.load:g} undecided at {e.requests} requests" for e in open_)
    return st


def result(st: SearchState, t: Targets, spec: SearchSpec) -> dict[str, Any]:
    """The search's answer as a plain dict (run.json `capacity.result`)."""
    lo, hi = st.lo, st.hi
    best = lo.trials[-1] if lo else None
    out: dict[str, Any] = {
        "axis": spec.axis, "capacity": lo.load if lo else None, "bracket": [lo.load if lo else None,
                                                                             hi.load if hi else None],
        "binding": hi.binding if hi else None, "settled": bool(lo and lo.settled and (hi is None or hi.settled)),
        "done": st.done, "reason": st.reason,
        "trials": sum(len(v.trials) for v in st.verdicts) + (1 if st.outlier else 0),  # the outlier ran too
        "loads": [v.to_dict() for v in st.verdicts], "non_monotone": st.non_monotone,
        "targets": t.terms(), "ends": {"low": lo.to_dict() if lo else None, "high": hi.to_dict() if hi else None},
        "first_outlier": _finite(st.outlier) if st.outlier else None,
        "at_target": [{"load": v.load, "requests": v.requests} for v in st.at],
    }
    if best is not None:
        pooled = lo.trials
        out["output_tps"] = _mean([tr.output_tps for tr in pooled])
        out["request_rps"] = _mean([tr.request_rps for tr in pooled])
        out["in_flight"] = _mean([tr.in_flight for tr in pooled])
    if hi is not None:
        out["binding_measured"] = hi.measured.get(hi.binding) if hi.binding else None
    out["fit"] = fitted(st, t, spec)
    return out


def fitted(st: SearchState, t: Targets, spec: SearchSpec) -> dict[str, Any] | None:
    """The capacity read off every trial near the bracket at once: each trial's own log p95
    (>= `SPREAD_MIN_REQUESTS` requests) against log load, one line per latency term that some
    trial there missed, and the load where the first line reaches its target (`crossing`), with
    one-sided 95 % bounds. Loads from the low end / `growth` to the high end x `growth`. None
    without both ends, and on the rate axis: past an open loop's capacity its queue grows for as
    long as the trial runs, so a p95 there is no function of the load that a line could follow.
    The bounds hold for the minutes the search ran: a machine whose speed moves between searches
    moves this load too (docs/capacity.md)."""
    if st.lo is None or st.hi is None or spec.axis == "rate":
        return None
    g = spec.growth
    trials = [tr for v in st.verdicts if st.lo.load / g <= v.load <= st.hi.load * g for tr in v.trials]
    best = None
    for term, target in t.terms().items():
        if term == "error_rate":
            continue
        pts = [(tr.load, q) for tr in trials if (q := _trial_q(tr, term)) is not None and tr.load > 0]
        if not any(q > math.log(target) for _, q in pts):
            continue
        c = crossing([math.log(x) for x, _ in pts], [q for _, q in pts], math.log(target))
        if c is None:
            continue
        f = {"term": term, "trials": c["n"], "load": math.exp(c["estimate"]), "sd": c["sd"], "slope": c["slope"],
             "lower": math.exp(c["lower"]) if c["lower"] is not None else None,
             "upper": math.exp(c["upper"]) if c["upper"] is not None else None,
             "loads": [min(x for x, _ in pts), max(x for x, _ in pts)]}
        if best is None or f["load"] < best["load"]:
            best = f
    return best


def _mean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x == x]
    return sum(xs) / len(xs) if xs else None


def grid_around(bracket: list[float | None], spec: SearchSpec) -> list[float]:
    """A fixed grid to check a search against: half the low end, the low end, the midpoint, the
    high end and twice it (snapped like the search's loads)."""
    lo, hi = bracket
    hi = hi if hi is not None else lo * spec.growth
    pts = [lo / 2, lo, (lo + hi) / 2, hi, hi * 2]
    return sorted({spec.snap(x) for x in pts if x > 0})
