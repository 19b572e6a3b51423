"""The capacity search's rules (measure.slo_search) on synthetic trials: a server whose verdict
at each load is known, so the bracket, the repeats and the stop rule can be checked exactly."""

from __future__ import annotations

import itertools

import pytest

from servelab.measure.slo_search import (SearchSpec, Targets, Trial, interval_verdict, load_verdict, result, state)

T = Targets(ttft_p95_s=1.0, tpot_p95_s=None, error_rate=0.01)


def _trial(level: int, load: float, passes: bool, n: int = 40) -> Trial:
    # a pass: every TTFT well under the target; a fail: every TTFT well over it
    ttft = [0.3] * n if passes else [3.0] * n
    return Trial(level, load, ttft, [0.01] * n, n, 0, output_tps=load * 100, request_rps=load, in_flight=load / 2)


def _search(capacity: float, spec: SearchSpec, verdict=None) -> tuple[list[Trial], object]:
    verdict = verdict or (lambda load, k: load <= capacity)
    trials: list[Trial] = []
    for _ in range(100):
        st = state(trials, T, spec)
        if st.done:
            return trials, st
        k = sum(1 for t in trials if t.load == st.next_load)
        trials.append(_trial(len(trials), st.next_load, verdict(st.next_load, k)))
    raise AssertionError("search did not stop")


def test_bracket_then_bisect_finds_a_known_capacity_within_precision():
    spec = SearchSpec(start=1.0, max_load=256, precision=0.1, repeats=2, max_trials=30)
    trials, st = _search(7.3, spec)
    loads = [t.load for t in trials]
    assert loads[:5] == [1.0, 2.0, 4.0, 8.0, 6.0]  # doubles until 8 fails, then bisects 4..8
    assert st.lo.load <= 7.3 < st.hi.load
    assert (st.hi.load - st.lo.load) / st.lo.load <= 0.1
    assert len(st.lo.trials) == 2 and st.lo.how == "repeats agree"  # a pass needs its repeat
    assert len(st.hi.trials) == 1 and st.hi.how == "interval"  # 40 of 40 over the target: settled at once
    assert st.reason == "bracket narrow and both ends beyond noise"
    assert len(trials) <= spec.worst_case_trials()


def test_first_trial_failing_lowers_the_load():
    trials, st = _search(0.3, SearchSpec(start=1.0, min_load=0.05, precision=0.1))
    assert [t.load for t in trials][:3] == [1.0, 0.5, 0.25]
    assert st.lo.load <= 0.3 < st.hi.load


def test_no_fail_up_to_the_maximum_stops_with_capacity_at_least_max():
    trials, st = _search(1e9, SearchSpec(start=1.0, max_load=8))
    assert [t.load for t in trials] == [1.0, 2.0, 4.0, 8.0, 8.0]
    assert st.hi is None and st.lo.load == 8.0
    res = result(st, T, SearchSpec(start=1.0, max_load=8))
    assert res["capacity"] == 8.0 and res["binding"] is None and res["bracket"] == [8.0, None]


def test_noisy_end_is_repeated_up_to_max_repeats_then_stops_flagged():
    flip = itertools.cycle([True, False])

    def verdict(load, k):  # the load just under the boundary alternates pass/fail on repeats
        if load <= 6.0:
            return True
        if load >= 7.0:
            return False
        return next(flip)

    spec = SearchSpec(start=1.0, precision=0.1, repeats=2, max_repeats=3)
    trials, st = _search(6.5, spec, verdict)
    # bisection: 1, 2, 4, 8 (fail), 6, 7 (fail), 6.5 (pass, first of the cycle)
    assert [t.load for t in trials][:7] == [1.0, 2.0, 4.0, 8.0, 6.0, 7.0, 6.5]
    at = [t for t in trials if t.load == 6.5]
    assert len(at) >= 2  # repeated at the boundary
    assert st.done


def test_trial_budget_stops_with_best_so_far():
    spec = SearchSpec(start=1.0, max_trials=4)
    trials, st = _search(7.3, spec)
    assert len(trials) == 4 and st.reason.startswith("trial budget spent")
    assert st.lo.load == 4.0 and st.hi.load == 8.0


def test_interval_settles_a_clear_fail_but_not_a_marginal_one():
    clear = Trial(0, 5.0, [2.0] * 30, [], 30, 0)
    assert interval_verdict([clear], T) == "fail"
    marginal = Trial(0, 5.0, [0.5] * 27 + [2.0] * 3, [], 30, 0)  # 10 % over: p95 over, but n=30 is noise
    assert interval_verdict([marginal], T) is None
    v = load_verdict([marginal], T, repeats=2)
    assert not v.passes and not v.settled and v.how == "too few trials"


def test_error_rate_binds_when_requests_fail():
    t = Trial(0, 5.0, [0.2] * 20, [], 40, 20)  # half failed, the rest fast
    v = load_verdict([t], T, repeats=2)
    assert not v.passes and v.binding == "error_rate" and v.settled


def test_concurrency_axis_snaps_to_integers_and_stops_at_adjacent():
    spec = SearchSpec(axis="concurrency", start=1, min_load=1, max_load=64, precision=0.1)
    trials, st = _search(11, spec)
    assert all(t.load == int(t.load) for t in trials)
    assert (st.lo.load, st.hi.load) == (11.0, 12.0)


def test_worst_case_trials_counts_bracket_bisect_and_repeats():
    spec = SearchSpec(start=1.0, max_load=64, precision=0.1, max_repeats=3, max_trials=99)
    # 6 doublings to 64, ceil(log2(1/0.1)) = 4 bisections, 2 x 2 extra repeats, the first trial
    assert spec.worst_case_trials() == 1 + 6 + 4 + 4


def test_binomial_tails_match_scipy():
    from scipy.stats import binom

    from servelab.measure.slo_search import binom_cdf, binom_sf

    for n, k, p in [(30, 0, 0.05), (30, 3, 0.05), (59, 0, 0.05), (400, 31, 0.05), (40, 40, 0.05), (299, 0, 0.01)]:
        assert binom_cdf(k, n, p) == pytest.approx(binom.cdf(k, n, p), rel=1e-9, abs=1e-15)
        assert binom_sf(k - 1, n, p) == pytest.approx(binom.sf(k - 1, n, p), rel=1e-9, abs=1e-15)
