"""The capacity search driver (measure.capacity) on the reference server with a known capacity:
`slots` streams at once, each held for a programmed time, so open-loop arrivals above
slots / service time queue and TTFT grows without bound. The search must bracket that load;
its trials are ordinary levels (records, levels.jsonl), a time budget stops it early with the
best result so far, and resume continues from the finished trials."""

from __future__ import annotations

import json
import statistics

import pytest

from servelab.cli import main
from servelab.measure.capacity import TrialShape, run_capacity, trials_in
from servelab.measure.refserver import Behaviour, RefServer
from servelab.measure.runinfo import base_record
from servelab.measure.slo_search import SearchSpec, Targets
from servelab.runfolder import RunFolder, read_jsonl
from servelab.schema import AttachParams, Bucket, Workload
from servelab.hosts.attach import attach

SLOTS, TTFT_S, ITL_S, TOKENS = 4, 0.05, 0.01, 16
SERVICE_S = TTFT_S + (TOKENS - 1) * ITL_S  # 0.2 s a stream holds its slot
CAPACITY_RPS = SLOTS / SERVICE_S  # 20 req/s: above it the queue grows for the whole trial
DURATION_S = 2.0
TARGET_TTFT_S = 0.25


def _threshold_rps() -> float:
    """The highest constant rate whose p95 TTFT stays under the target in a D/D/N queue of one
    trial (exact for the programmed server: arrivals i/r, service SERVICE_S, SLOTS servers)."""
    import numpy as np

    def p95_ttft(r: float) -> float:
        n = max(1, round(r * DURATION_S))
        free = [0.0] * SLOTS
        ttft = []
        for i in range(n):
            t = i / r
            k = min(range(SLOTS), key=lambda j: free[j])
            start = max(t, free[k])
            free[k] = start + SERVICE_S
            ttft.append(start - t + TTFT_S)
        return float(np.percentile(ttft, 95))

    lo, hi = 1.0, 200.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if p95_ttft(mid) <= TARGET_TTFT_S else (lo, mid)
    return lo


def _workload() -> Workload:
    return Workload(buckets=[Bucket(input_tokens=16, output_tokens=TOKENS)], concurrency=[1], arrival="constant",
                    rates_rps=[1.0], metrics_interval_s=0)


SPEC = SearchSpec(start=4.0, max_load=128, precision=0.1, repeats=2, max_repeats=3, max_trials=14)
TARGETS = Targets(ttft_p95_s=TARGET_TTFT_S, tpot_p95_s=None, error_rate=0.01)
SHAPE = TrialShape(duration_s=DURATION_S)


@pytest.fixture(scope="module")
def ref():
    with RefServer(Behaviour(ttft_s=TTFT_S, itl_s=ITL_S, slots=SLOTS)) as s:
        yield s


def test_known_capacity_lies_in_the_bracket(ref, tmp_path):
    srv = attach(AttachParams(url=ref.url))
    out = run_capacity(srv, _workload(), tmp_path / "cap", SPEC, TARGETS, shape=SHAPE, study="t", config_id="cap",
                       record=base_record("t", "cap"))
    res = out.result
    lo, hi = res["bracket"]
    thr = _threshold_rps()
    assert 20.0 < thr < 23.0  # the programmed server's own number (queueing starts at 20 req/s)
    # the client and server add a little per request on a busy machine: 5 % slack on either side
    assert lo <= thr * 1.05 and hi >= CAPACITY_RPS * 0.95, (res, thr)
    # both ends decided; the bracket within the precision, or as narrow as the noise allows: a load
    # bisected to right at the threshold stays undecided (its p95 is on the target) and is listed
    inside = [a["load"] for a in res["at_target"] if lo < a["load"] < hi]
    assert (hi - lo) / lo <= SPEC.precision or inside, res
    assert res["binding"] == "ttft_p95_s" and res["settled"], res
    assert out.status == "complete" and out.line.startswith(f"capacity at SLO: {lo:g} req/s (")
    # every trial is an ordinary level: records and levels.jsonl, one level index per trial
    levels = read_jsonl(out.run_dir / "levels.jsonl")
    assert [x["level"] for x in levels] == list(range(res["trials"]))
    run = RunFolder(out.run_dir).run
    assert run["capacity"]["result"]["bracket"] == [lo, hi] and run["status"] == "complete"
    assert set(RunFolder(out.run_dir).summary["rate_rps"]) == {v["load"] for v in res["loads"]}
    # Little's law at the capacity: rate x mean e2e, which is at least the service time and at
    # most the service time plus the TTFT target (queueing included)
    assert lo * SERVICE_S * 0.95 <= res["in_flight"] <= lo * (SERVICE_S + TARGET_TTFT_S)


def test_budget_stops_early_and_resume_continues(ref, tmp_path):
    srv = attach(AttachParams(url=ref.url))
    rdir = tmp_path / "cap"
    first = run_capacity(srv, _workload(), rdir, SPEC, TARGETS, shape=SHAPE, study="t", config_id="cap",
                         record=base_record("t", "cap"), budget_s=3 * DURATION_S * 1.5 + 0.5)  # the first trial warms up
    assert first.status == "partial" and "time budget" in first.message
    # the first trial and its repeat (4 req/s twice, both pass): the best so far
    assert first.result["trials"] == 2 and first.result["bracket"] == [4.0, None]
    with pytest.raises(FileExistsError):
        run_capacity(srv, _workload(), rdir, SPEC, TARGETS, shape=SHAPE, study="t", config_id="cap",
                     record=base_record("t", "cap"))
    again = run_capacity(srv, _workload(), rdir, SPEC, TARGETS, shape=SHAPE, study="t", config_id="cap",
                         record=base_record("t", "cap"), resume=True)
    assert again.status == "complete"
    loads = [t.load for t in trials_in(rdir, "rate")]
    assert loads[:4] == [4.0, 4.0, 8.0, 16.0]  # the finished trials were kept, the search went on from them
    assert again.result["bracket"][0] <= _threshold_rps() * 1.05
    assert RunFolder(rdir).run["resumed"][0]["previous_status"] == "partial"


def test_cli_dry_run_states_worst_case(capsys):
    assert main(["capacity", "http://127.0.0.1:9", "--slo-ttft-p95-s", "1", "--max", "64", "--duration", "10",
                 "--dry-run"]) == 0
    out = capsys.readouterr().out
    # the first trial and its repeat + 6 doublings + 4 bisections + 2 x 3 extensions (--max-repeats 4) = 18,
    # under the 24 trials of --max-trials; each 10 s x 1.5 drain
    assert out.strip() == "worst case: 1 server start(s) x (18 trials x 15 s) = 270 s (4.5 min)"


def test_cli_against_the_reference_server(ref, tmp_path, capsys):
    # three light trials (2 req/s and its repeat, then 4, far under the known 20): the best so far, no upper end yet
    rc = main(["capacity", ref.url, "--input", "16", "--output", str(TOKENS), "--slo-ttft-p95-s", str(TARGET_TTFT_S),
               "--arrival", "constant", "--start", "2", "--max", "128", "--duration", str(DURATION_S),
               "--metrics-interval", "0", "--max-trials", "3", "--out", str(tmp_path / "c")])
    out = capsys.readouterr().out
    assert rc == 0, out
    line = next(x for x in out.splitlines() if x.startswith("capacity at SLO:"))
    res = json.loads((tmp_path / "c" / "run.json").read_text())["capacity"]["result"]
    assert [v["load"] for v in res["loads"]] == [2.0, 4.0] and res["bracket"] == [4.0, None]
    assert [len(v["trials"]) for v in res["loads"]] == [2, 1]
    assert line.startswith("capacity at SLO: 4 req/s (") and "bracket [4, -] req/s" in line
    assert "trial budget spent (3 trials)" in line and "low end 4 req/s undecided at" in line


def test_closed_loop_trials_start_their_workers_over_one_request(ref, tmp_path):
    """A closed loop of one forced length started at once runs in step (a wave whose prompts are
    prefilled together, sharing one TTFT). A trial after the first starts its workers over one
    request's duration measured at the nearest load tried; each worker's first request is warm-up."""
    from servelab.measure.capacity import ramp_for, trial_workload

    srv = attach(AttachParams(url=ref.url))
    wl = Workload(buckets=[Bucket(input_tokens=16, output_tokens=TOKENS)], concurrency=[1], metrics_interval_s=0)
    spec = SearchSpec(axis="concurrency", start=2, min_load=1, max_load=4, repeats=1, max_repeats=1, max_trials=3)
    out = run_capacity(srv, wl, tmp_path / "cap", spec, Targets(ttft_p95_s=5.0, tpot_p95_s=None, error_rate=0.01),
                       shape=TrialShape(requests_per_round=2), study="t", config_id="cap",
                       record=base_record("t", "cap"))
    recs = read_jsonl(out.run_dir / "records.jsonl")
    later = [r for r in recs if r["level"] > 0 and r["concurrency"] > 1]
    assert later, out.result
    for lvl in sorted({r["level"] for r in later}):
        rs = [r for r in later if r["level"] == lvl]
        c = rs[0]["concurrency"]
        ramp = [r for r in rs if r.get("ramp")]
        assert len(ramp) == c and all(r["warmup"] for r in ramp)  # one per worker, left out
        assert sum(not r["warmup"] for r in rs) == 2 * c  # the measured requests are still k x c
        starts = sorted(r["start_s"] for r in ramp)
        assert starts[-1] - starts[0] >= 0.5 * SERVICE_S * (c - 1) / c  # spread, not all at once
    # the first trial has nothing to measure a request by: its workers start together
    assert not any(r.get("ramp") for r in recs if r["level"] == 0)
    trials = trials_in(out.run_dir, "concurrency")
    near = next(t for t in trials if t.load == max(x.load for x in trials))  # the nearest to 4, the first of a tie
    assert ramp_for(trials, 4, TOKENS) == pytest.approx(
        statistics.median(near.ttft_s) + (TOKENS - 1) * statistics.median(near.tpot_s))
    assert ramp_for([], 4, TOKENS) == 0.0
    assert trial_workload(wl, spec, TrialShape(), 4, ramp_s=0.5).concurrency_ramp_s == 0.5
    assert trial_workload(wl, spec, TrialShape(ramp=False), 4, ramp_s=0.5).concurrency_ramp_s is None
    assert trial_workload(wl, spec, TrialShape(), 1, ramp_s=0.5).concurrency_ramp_s is None  # one worker: nothing to spread
    with pytest.raises(ValueError, match="closed loop"):
        Workload(buckets=wl.buckets, concurrency=[1], arrival="constant", rates_rps=[1.0], concurrency_ramp_s=1.0)
    with pytest.raises(ValueError, match="workers must be 1"):
        Workload(buckets=wl.buckets, concurrency=[1], workers=2, concurrency_ramp_s=1.0)
