"""The capacity-at-SLO search as pure functions: verdicts of trials and loads, the bracket, the
next load to run, the stop rule and the worst-case cost.

A trial is one ordinary load level (an open-loop request rate, or a closed-loop concurrency)
whose measured requests give a p95 TTFT, a p95 TPOT and an error rate. A load passes when every
SLO term it has is met. The search is monotone: double the load until a trial fails (bracket),
then bisect; at the bracket's ends it repeats trials until the verdict there is beyond
run-to-run noise — the repeated trials agree, or an exact binomial interval on the share of
requests over the target (which is what "p95 over the SLO" means) excludes 5 %. It stops when
the bracket is narrower than `precision` of its lower end and both ends are settled, or when
its trial count is spent. Everything is a function of the trials so far, so a resumed search
replays the same decisions. No I/O: the driver (`measure.capacity`) runs the trials; the
report (`analysis.capacity`) reads them back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable

# the SLO's percentile: p95 over the target <=> more than 5 % of requests over it
SLO_QUANTILE = 0.95
ALPHA = 0.05  # one-sided level of the binomial interval

TERMS = ("ttft_p95_s", "tpot_p95_s", "error_rate")


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
    import numpy as np

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
    if not over:
        return None
    return max(over, key=lambda k: (over[k] if over[k] == over[k] else math.inf))


def _binom_pmf(i: int, n: int, p: float) -> float:
    if p <= 0:
        return 1.0 if i == 0 else 0.0
    if p >= 1:
        return 1.0 if i == n else 0.0
    return math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
                    + i * math.log(p) + (n - i) * math.log1p(-p))


def binom_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p) (exact sum; no scipy on the GPU device's image)."""
    return min(1.0, sum(_binom_pmf(i, n, p) for i in range(0, min(k, n) + 1))) if k >= 0 else 0.0


def binom_sf(k: int, n: int, p: float) -> float:
    """P(X > k)."""
    return min(1.0, sum(_binom_pmf(i, n, p) for i in range(max(k + 1, 0), n + 1)))


def _exceed_share_test(values: list[float], target: float, failed: int, q: float) -> str | None:
    """'pass'/'fail' when an exact one-sided binomial test at ALPHA settles whether more than
    (1-q) of the requests exceed `target` (failed requests count as exceeding), else None."""
    n = len(values) + failed
    if n == 0:
        return None
    k = sum(1 for x in values if x > target) + failed
    p = 1 - q
    if binom_sf(k - 1, n, p) < ALPHA:  # P(X >= k) small: more exceed than a met SLO allows
        return "fail"
    if binom_cdf(k, n, p) < ALPHA:  # P(X <= k) small: fewer exceed than the limit
        return "pass"
    return None


def interval_verdict(trials: list[Trial], t: Targets) -> str | None:
    """Pooled over a load's trials: 'fail' when some term is over its target beyond noise,
    'pass' when every term is under it beyond noise, else None."""
    ttft = [x for tr in trials for x in tr.ttft_s]
    tpot = [x for tr in trials for x in tr.tpot_s]
    failed = sum(tr.failed for tr in trials)
    sent = sum(tr.sent for tr in trials)
    out = []
    if t.ttft_p95_s is not None:
        out.append(_exceed_share_test(ttft, t.ttft_p95_s, failed, SLO_QUANTILE))
    if t.tpot_p95_s is not None:
        out.append(_exceed_share_test(tpot, t.tpot_p95_s, failed, SLO_QUANTILE))
    if sent:
        out.append(_exceed_share_test([0.0] * (sent - failed), 0.5, failed, 1 - t.error_rate)
                   if t.error_rate < 1 else "pass")
    if "fail" in out:
        return "fail"
    if out and all(v == "pass" for v in out):
        return "pass"
    return None


@dataclass
class LoadVerdict:
    load: float
    trials: list[Trial]
    passes: bool  # pooled point verdict
    settled: bool  # beyond noise: repeats agree, or the interval decides
    how: str  # "repeats agree" | "interval" | "within noise" | "too few trials"
    measured: dict[str, float]
    binding: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"load": self.load, "trials": [tr.level for tr in self.trials], "passes": self.passes,
                "settled": self.settled, "how": self.how, "measured": self.measured, "binding": self.binding}


def load_verdict(trials: list[Trial], t: Targets, repeats: int) -> LoadVerdict:
    m = measured([x for tr in trials for x in tr.ttft_s], [x for tr in trials for x in tr.tpot_s],
                 sum(tr.sent for tr in trials), sum(tr.failed for tr in trials))
    passes = point_verdict(m, t)
    each = [point_verdict(measured(tr.ttft_s, tr.tpot_s, tr.sent, tr.failed), t) for tr in trials]
    iv = interval_verdict(trials, t)
    if iv is not None and (iv == "pass") == passes:
        settled, how = True, "interval"
    elif len(trials) >= repeats and all(e == passes for e in each):
        settled, how = True, "repeats agree"
    else:
        settled, how = False, "too few trials" if len(trials) < repeats else "within noise"
    return LoadVerdict(trials[0].load, trials, passes, settled, how, m, binding(m, t))


@dataclass(frozen=True)
class SearchSpec:
    """How the search runs (the `capacity:` block, or `servelab capacity`'s options)."""

    axis: str = "rate"  # "rate" (req/s, open loop) or "concurrency" (closed loop)
    start: float = 1.0
    min_load: float = 0.125
    max_load: float = 256.0
    growth: float = 2.0
    precision: float = 0.1  # stop when (hi - lo) / lo <= this
    repeats: int = 2  # trials needed at each end when the interval does not decide
    max_repeats: int = 3  # at most this many trials at one load
    max_trials: int = 16

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
        """Bracket doublings from start to the far end, bisection to `precision`, and the
        repeats at both ends; never more than max_trials."""
        g = math.log(self.growth)
        up = math.ceil(math.log(self.max_load / self.start) / g) if self.max_load > self.start else 0
        down = math.ceil(math.log(self.start / self.min_load) / g) if self.start > self.min_load else 0
        bisect = math.ceil(math.log2((self.growth - 1) / self.precision)) if self.precision < self.growth - 1 else 0
        return min(self.max_trials, 1 + max(up, down) + bisect + 2 * (self.max_repeats - 1))


@dataclass
class SearchState:
    verdicts: list[LoadVerdict]  # by load, ascending
    lo: LoadVerdict | None  # highest passing load below every failing one
    hi: LoadVerdict | None  # lowest failing load above lo
    next_load: float | None
    reason: str  # why it stopped, or what the next trial is for
    non_monotone: list[float] = field(default_factory=list)  # passing loads above a failing one

    @property
    def done(self) -> bool:
        return self.next_load is None


def group(trials: Iterable[Trial]) -> dict[float, list[Trial]]:
    out: dict[float, list[Trial]] = {}
    for tr in trials:
        out.setdefault(tr.load, []).append(tr)
    return dict(sorted(out.items()))


def state(trials: list[Trial], t: Targets, spec: SearchSpec) -> SearchState:
    """Where the search stands after `trials`, and the next load to run (None = stop)."""
    vs = [load_verdict(trs, t, spec.repeats) for trs in group(trials).values()]
    fails = [v for v in vs if not v.passes]
    hi = fails[0] if fails else None
    below = [v for v in vs if v.passes and (hi is None or v.load < hi.load)]
    lo = below[-1] if below else None
    odd = [v.load for v in vs if v.passes and hi is not None and v.load > hi.load]
    st = SearchState(vs, lo, hi, None, "", odd)
    if len(trials) >= spec.max_trials:
        st.reason = f"trial budget spent ({spec.max_trials} trials)"
        return st
    if not trials:
        st.next_load, st.reason = spec.snap(spec.start), "first trial"
        return st
    if hi is None:
        if lo.load >= spec.max_load:
            return _settle_or(st, spec, lo, None, f"capacity is at least the highest load searched ({spec.max_load:g})")
        st.next_load, st.reason = spec.snap(min(lo.load * spec.growth, spec.max_load)), "bracket: raise the load"
        return st
    if lo is None:
        if hi.load <= spec.min_load:
            st.reason = f"even the lowest load searched ({spec.min_load:g}) misses the SLO"
            return st
        st.next_load, st.reason = spec.snap(max(hi.load / spec.growth, spec.min_load)), "bracket: lower the load"
        return st
    if not spec.narrow(lo.load, hi.load):
        mid = spec.snap((lo.load + hi.load) / 2)
        if lo.load < mid < hi.load:
            st.next_load, st.reason = mid, "bisect"
            return st
    return _settle_or(st, spec, lo, hi, "bracket narrow and both ends beyond noise")


def _settle_or(st: SearchState, spec: SearchSpec, lo: LoadVerdict, hi: LoadVerdict | None, done: str) -> SearchState:
    for end in (lo, hi):
        if end is not None and not end.settled and len(end.trials) < spec.max_repeats:
            st.next_load, st.reason = end.load, "repeat at the bracket's end"
            return st
    st.reason = done if all(e is None or e.settled for e in (lo, hi)) else done.replace(
        "both ends beyond noise", "an end within noise after the most repeats")
    return st


def result(st: SearchState, t: Targets, spec: SearchSpec) -> dict[str, Any]:
    """The search's answer as a plain dict (run.json `capacity.result`)."""
    lo, hi = st.lo, st.hi
    best = lo.trials[-1] if lo else None
    out: dict[str, Any] = {
        "axis": spec.axis, "capacity": lo.load if lo else None, "bracket": [lo.load if lo else None,
                                                                             hi.load if hi else None],
        "binding": hi.binding if hi else None, "settled": bool(lo and lo.settled and (hi is None or hi.settled)),
        "done": st.done, "reason": st.reason, "trials": sum(len(v.trials) for v in st.verdicts),
        "loads": [v.to_dict() for v in st.verdicts], "non_monotone": st.non_monotone,
        "targets": t.terms(),
    }
    if best is not None:
        pooled = lo.trials
        out["output_tps"] = _mean([tr.output_tps for tr in pooled])
        out["request_rps"] = _mean([tr.request_rps for tr in pooled])
        out["in_flight"] = _mean([tr.in_flight for tr in pooled])
    if hi is not None:
        out["binding_measured"] = hi.measured.get(hi.binding) if hi.binding else None
    return out


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
