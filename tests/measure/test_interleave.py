"""Interleaved measurement (measure.interleave) against reference servers of known speed: every
start writes its own run folder, rounds alternate their order (A B C, C B A), each round sends every
start the same prompts, the idle starts' CPU is measured, and the sampling rule decides the rounds."""

from __future__ import annotations

import pandas as pd

from servelab.hosts.base import Server
from servelab.measure.interleave import Start, run_interleaved
from servelab.measure.runinfo import base_record
from servelab.runfolder import read_json, read_jsonl
from servelab.schema import Bucket, Workload


def _wl(**kw) -> Workload:
    base = dict(buckets=[Bucket(input_tokens=20, output_tokens=8)], concurrency=[1, 2], warmup_rounds=0, rounds=2,
                requests_per_round=1, timeout_s=10)
    base.update(kw)
    return Workload(**base)


def _starts(servers: dict[str, object], tmp_path) -> list[Start]:
    return [Start(sid, Server(base_url=s.url, model="ref"), tmp_path / sid, base_record("t", sid))
            for sid, s in servers.items()]


def test_rounds_alternate_and_share_their_prompts(refserver, tmp_path):
    servers = {sid: refserver(ttft_s=0.005, itl_s=0.001) for sid in ("a", "b", "c")}
    results, sampling = run_interleaved(_starts(servers, tmp_path), _wl(), study="t")
    assert {r.status for r in results.values()} == {"complete"}
    # first attempts only: a round another process disturbed (a test running beside this one) is measured again
    recs = {sid: [r for r in read_jsonl(tmp_path / sid / "records.jsonl") if not r.get("attempt")] for sid in servers}
    assert {sid: len(r) for sid, r in recs.items()} == {"a": 6, "b": 6, "c": 6}  # (1 + 2) x 2 rounds
    # the order of the starts within each round: a b c, then c b a
    first = sorted(((r["level"], r["round"], r["start_s"], sid) for sid, rs in recs.items() for r in rs))
    order = {}
    for lv, rnd, _, sid in first:
        order.setdefault((lv, rnd), [])
        if sid not in order[(lv, rnd)]:
            order[(lv, rnd)].append(sid)
    assert order[(0, 0)] == ["a", "b", "c"] and order[(0, 1)] == ["c", "b", "a"] and order[(1, 0)] == ["a", "b", "c"]
    # the same round of a level sends the same prompt lengths everywhere; its own levels.jsonl per start
    for sid in servers:
        lv = read_jsonl(tmp_path / sid / "levels.jsonl")
        assert [x["sampling"]["stopped"] for x in lv] == ["fixed", "fixed"]
        assert read_json(tmp_path / sid / "run.json")["status"] == "complete"
    assert [x.stopped for x in sampling] == ["fixed", "fixed"]


def test_idle_neighbours_cpu_is_recorded_per_round(refserver, tmp_path):
    """Each start's process tree (here: idle stand-ins) is sampled while another is measured."""
    import subprocess
    import sys

    idle = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(2)]
    try:
        servers = {sid: refserver(ttft_s=0.005, itl_s=0.001) for sid in ("a", "b")}
        starts = _starts(servers, tmp_path)
        for s, p in zip(starts, idle):
            s.pid = p.pid
        run_interleaved(starts, _wl(), study="t")
    finally:
        for p in idle:
            p.kill()
    stats = [s for s in read_jsonl(tmp_path / "a" / "client_stats.jsonl") if not s.get("attempt")]
    assert len(stats) == 4 and all(s["neighbours"] == 1 for s in stats)
    assert all(0 <= s["neighbour_cpu_frac_max"] < 0.5 for s in stats)  # a sleeping process uses ~0


def test_the_sampling_rule_adds_rounds_only_where_asked(refserver, tmp_path):
    servers = {sid: refserver(ttft_s=0.005, itl_s=0.001) for sid in ("base", "change")}
    asked = []

    def decide(li: int, rounds: pd.DataFrame, finer: bool) -> tuple[set[str], str]:
        n = rounds.groupby("config")["round"].nunique().to_dict()
        asked.append((li, n))
        if li == 0 and n["change"] < 4:
            return {"base", "change"}, "open"
        return set(), "settled"

    import time

    results, sampling = run_interleaved(_starts(servers, tmp_path), _wl(), study="t", decide=decide,
                                        deadline=time.monotonic() + 60, max_rounds=10)
    assert [x.stopped for x in sampling] == ["settled", "settled"]
    assert sampling[0].rounds == {"base": 4, "change": 4} and sampling[1].rounds == {"base": 2, "change": 2}
    assert asked[0] == (0, {"base": 2, "change": 2})  # the workload's rounds first, then one at a time
    recs = read_jsonl(tmp_path / "change" / "records.jsonl")
    assert sorted({r["round"] for r in recs if r["level"] == 0}) == [0, 1, 2, 3]


def test_a_level_stops_at_its_share_of_the_budget(refserver, tmp_path):
    servers = {sid: refserver(ttft_s=0.05, itl_s=0.01) for sid in ("base", "change")}
    import time

    _, sampling = run_interleaved(_starts(servers, tmp_path), _wl(concurrency=[1]), study="t",
                                  decide=lambda li, r, finer: ({"base", "change"}, "open"),
                                  deadline=time.monotonic() + 1.5, max_rounds=50)
    assert sampling[0].stopped == "budget"
    assert 2 <= sampling[0].rounds["base"] < 50


def test_past_its_share_a_level_goes_on_only_for_comparisons_above_the_aim(refserver, tmp_path):
    """A level whose share is spent goes on while the rule names starts without its finer aim (asked
    with finer=False), on time the later levels lend (at most BORROW of the share); a level whose
    comparisons are only above the finer aim stops at its share."""
    import time

    from servelab.measure import interleave

    servers = {sid: refserver(ttft_s=0.05, itl_s=0.01) for sid in ("base", "change")}
    asked: list[tuple[int, bool]] = []

    def coarse_open_at_level_0(li: int, r: pd.DataFrame, finer: bool) -> tuple[set[str], str]:
        asked.append((li, finer))
        return ({"base", "change"}, "open") if li == 0 or finer else (set(), "at the aim")

    budget = 6.0
    t0 = time.monotonic()
    _, sampling = run_interleaved(_starts(servers, tmp_path), _wl(concurrency=[1, 2, 4], rounds=1), study="t",
                                  decide=coarse_open_at_level_0, deadline=t0 + budget, max_rounds=200)
    share = (1 - interleave.RESERVE) * budget / 3
    assert [x.stopped for x in sampling] == ["budget", "budget", "budget"]
    assert (0, False) in asked and (1, False) in asked  # past the share, asked for the aim alone
    assert 0 < sampling[0].borrowed_s <= interleave.BORROW * share + 0.5  # one round may end past the limit
    assert sampling[0].seconds > share  # it went on past its share ...
    assert sampling[1].borrowed_s == 0 and sampling[2].borrowed_s == 0  # ... the others did not
    assert sampling[0].seconds + sampling[1].seconds + sampling[2].seconds < budget  # the run's budget holds
