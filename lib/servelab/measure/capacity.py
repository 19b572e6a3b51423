"""The capacity-at-SLO search driver: runs one trial level at a time with the ordinary runner.

Each trial is a single load level (`runner.LevelRunner` with a one-level plan) appended to the
run folder like any level: its records in records.jsonl, its end in levels.jsonl, level index =
trial number. `slo_search.state` reads the finished trials and names the next load; the driver
runs it, until the search stops, its trial count is spent or the time budget would be passed
(then the best result so far stands, and `resume=True` continues from the finished trials).
run.json carries the search's spec and targets from the start and its result at the end
(`capacity`). Not for the search rules (`slo_search`) or the write-up (`analysis.capacity`).
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from ..log import progress_line
from ..hosts.base import Server
from ..runfolder import LEVELS, RECORDS, RunFolder, read_typed
from ..schema import Workload
from .grid import make_sources
from .runfiles import finalize, open_run_folder
from .runner import Level, LevelRunner, RunResult, server_counter
from .slo_search import SearchSpec, Targets, Trial, result, state
from .rounds import run_sync

DRAIN_FACTOR = 1.5  # a trial's wall time over its nominal duration, for the budget (overload drains)
FIRST_WARMUP_ROUNDS = 1  # the first trial's warm-up: a fresh engine's first requests are slow


@dataclass
class TrialShape:
    """What one trial sends besides its load (from the workload and the `capacity:` block)."""

    duration_s: float = 10.0  # open loop: seconds of arrivals per round
    warmup_rounds: int = 0
    rounds: int = 1
    requests_per_round: int = 4  # closed loop: requests per round as a multiple of the concurrency
    ramp: bool = True  # closed loop: workers start over one request's duration (`ramp_for`)
    bucket: int = 0  # index into the workload's buckets


def ramp_for(trials: list[Trial], load: float, output_tokens: int | None) -> float:
    """Seconds over which a closed-loop trial at `load` starts its workers: one request's duration
    (median TTFT + (output - 1) x median TPOT) at the nearest load tried, the higher of two as
    near; 0 before any trial or without an output length."""
    done = [t for t in trials if t.ttft_s and t.tpot_s and t.load > 0]
    if not done or not output_tokens or load <= 0:
        return 0.0
    near = min(done, key=lambda t: (abs(math.log(t.load / load)), -t.load))
    return statistics.median(near.ttft_s) + max(int(output_tokens) - 1, 0) * statistics.median(near.tpot_s)


def trial_workload(wl: Workload, spec: SearchSpec, shape: TrialShape, load: float, *, first: bool = False,
                   ramp_s: float = 0.0) -> Workload:
    """The workload of one trial: one bucket, one level at `load`. The search's first trial warms
    the server up first (a round at its load, recorded as warm-up and left out). `ramp_s`: a closed
    loop's workers start over that many seconds (their first requests are warm-up)."""
    d = wl.model_dump()
    warm = max(shape.warmup_rounds, FIRST_WARMUP_ROUNDS) if first else shape.warmup_rounds
    d.update(buckets=[d["buckets"][shape.bucket]], warmup_rounds=warm, rounds=shape.rounds)
    if spec.axis == "rate":
        arrival = d["arrival"] if d["arrival"] != "concurrency" else "constant"
        d.update(arrival=arrival, rates_rps=[load], duration_s=shape.duration_s)
    else:
        d.update(arrival="concurrency", concurrency=[int(load)], requests_per_round=shape.requests_per_round,
                 concurrency_ramp_s=ramp_s if shape.ramp and ramp_s > 0 and int(load) > 1 else None)
    return Workload.model_validate(d)


def trial_nominal_s(spec: SearchSpec, shape: TrialShape, est_request_s: float = 0.0) -> float:
    """A trial's expected wall time (open loop: its arrivals plus a drain; closed loop: unknown
    without a request time, `est_request_s`)."""
    n = shape.warmup_rounds + shape.rounds
    if spec.axis == "rate":
        return n * shape.duration_s * DRAIN_FACTOR
    return n * shape.requests_per_round * max(est_request_s, 1.0)


def worst_case(spec: SearchSpec, shape: TrialShape, server_starts: int = 1, startup_s: float = 0.0) -> dict[str, Any]:
    """The search's worst-case cost, stated before it runs."""
    trials = spec.worst_case_trials()
    per = trial_nominal_s(spec, shape)
    total = server_starts * (startup_s + trials * per)
    return {"server_starts": server_starts, "trials": trials, "trial_s": per, "startup_s": startup_s,
            "total_s": total}


def worst_case_line(wc: dict[str, Any]) -> str:
    start = f" + {wc['startup_s']:.0f} s start" if wc["startup_s"] else ""
    return (f"worst case: {wc['server_starts']} server start(s) x ({wc['trials']} trials x {wc['trial_s']:.0f} s"
            f"{start}) = {wc['total_s']:.0f} s ({wc['total_s'] / 60:.1f} min)")


def trial_of(recs: list[dict[str, Any]], level: int, axis: str) -> Trial:
    """One finished trial from its records (measured rounds only)."""
    m = [r for r in recs if r.get("level") == level and not r.get("warmup")]
    ok = [r for r in m if r.get("ok")]
    load = float(m[0]["rate_rps"] if axis == "rate" else m[0]["concurrency"]) if m else float("nan")
    walls = {}
    for r in m:
        lo, hi = walls.get(r["round"], (r["start_s"], r["end_s"]))
        walls[r["round"]] = (min(lo, r["start_s"]), max(hi, r["end_s"]))
    wall = sum(hi - lo for lo, hi in walls.values())
    busy = sum(r.get("e2e_s") or 0.0 for r in ok)
    toks = sum(r.get("output_tokens") or 0 for r in ok)
    nan = float("nan")
    return Trial(level, load, [r["ttft_s"] for r in ok if r.get("ttft_s") is not None],
                 [r["tpot_s"] for r in ok if r.get("tpot_s") is not None], len(m), len(m) - len(ok),
                 output_tps=toks / wall if wall > 0 else nan, request_rps=len(ok) / wall if wall > 0 else nan,
                 in_flight=busy / wall if wall > 0 else nan)


def trials_in(run_dir: Path, axis: str) -> list[Trial]:
    """The finished trials of a run folder (levels.jsonl), in the order they ran."""
    rf = RunFolder(run_dir)
    recs = read_typed(rf.path / RECORDS)
    done = sorted({int(x["level"]) for x in read_typed(rf.path / LEVELS)})
    return [trial_of(recs, li, axis) for li in done]


def capacity_line(res: dict[str, Any]) -> str:
    """The one-line answer: 'capacity at SLO: X req/s (Y output tok/s, Z concurrent), bracket [a, b]'."""
    unit = "req/s" if res["axis"] == "rate" else "concurrent"
    lo, hi = res["bracket"]
    if res["capacity"] is None:
        below = f"below {hi:g} {unit}" if hi is not None else "undecided"
        return f"capacity at SLO: {below} (no load searched meets the SLO with 95 % confidence; {res['reason']})"
    rps, tps, cc = res.get("request_rps"), res.get("output_tps"), res.get("in_flight")
    head = (f"capacity at SLO: {res['capacity']:g} req/s" if res["axis"] == "rate"
            else f"capacity at SLO: {rps:.3g} req/s" if rps else "capacity at SLO: ?")
    detail = f"{tps:.3g} output tok/s, " if tps else ""
    detail += f"{cc:.1f} concurrent" if res["axis"] == "rate" and cc else f"{res['capacity']:g} concurrent"
    br = f"bracket [{lo:g}, {hi:g}] {unit}" if hi is not None else f"bracket [{lo:g}, -] {unit}"
    binds = (f"binds: {res['binding']} ({res['binding_measured']:.3g} > {res['targets'][res['binding']]:g} "
             f"at {hi:g})" if res.get("binding") and res.get("binding_measured") is not None
             else "binds: none up to the highest load searched")
    ends = "; ".join(x for x in (end_words("low end", (res.get("ends") or {}).get("low"), unit),
                                 end_words("high end", (res.get("ends") or {}).get("high"), unit)) if x)
    outlier = res.get("first_outlier")
    first = (f"; first trial an outlier (median {outlier['term'].split('_')[0].upper()} {outlier['first_median']:.3g} s "
             f"vs {outlier['repeat_median']:.3g} s on its repeat): left out" if outlier else "")
    fit = fit_words(res.get("fit"), unit)
    return f"{head} ({detail}), {br}; {binds}; {ends}{first}{'; ' + fit if fit else ''} [{res['reason']}]"


def fit_words(fit: dict[str, Any] | None, unit: str) -> str:
    """The capacity read off all trials near the bracket (`slo_search.fitted`), in words."""
    if not fit:
        return ""
    lo, up = fit.get("lower"), fit.get("upper")
    bounds = (f"95 % bounds {lo:.3g} to {up:.3g}" if lo is not None and up is not None
              else "its bounds open: the trials' spread hides the slope")
    a, b = fit["loads"]
    return (f"fitted over {fit['trials']} trials at {a:g}-{b:g} {unit}: p95 {fit['term'].split('_')[0].upper()} "
            f"reaches its target at {fit['load']:.3g} {unit} ({bounds})")


def end_words(name: str, end: dict[str, Any] | None, unit: str) -> str:
    """One bracket end in words and numbers: each SLO term's p95 with its one-sided 95 % bound
    against the target and the requests behind it; "undecided" when the interval straddles it."""
    if not end:
        return ""
    parts = []
    for term, x in (end.get("terms") or {}).items():
        if term == "error_rate":
            continue
        v, lo, up = x.get("value"), x.get("lower"), x.get("upper")
        label = term.split("_")[0].upper()
        deff = x.get("deff") or 1.0
        label += (f" (its trials differ: design effect {deff:.1f}, as if {x.get('n', 0) / deff:.0f} independent "
                  "requests)" if deff > 1.05 else "")
        if x.get("trial_sd") is not None:  # the bound is at least the trials' own (slo_search.term_interval)
            label += f" (its trials' p95 vary by {x['trial_sd'] * 100:.0f} % from trial to trial in this search)"
        if x.get("decided") == "pass":
            parts.append(f"p95 {label} {v:.3g} s, under its target with 95 % confidence (upper bound {up:.3g} s)")
        elif x.get("decided") == "fail":
            parts.append(f"p95 {label} {v:.3g} s, over its target with 95 % confidence (lower bound {lo:.3g} s)")
        else:
            bounds = f"{lo:.3g}" if lo is not None else "-"
            bounds += f" to {up:.3g} s" if up is not None else " s to unbounded"
            parts.append(f"p95 {label} {v:.3g} s, undecided (95 % bounds {bounds})")
    verdict = ("passes" if end.get("passes") else "fails") if end.get("settled") else (
        f"{'passes' if end.get('passes') else 'fails'} beyond its 95 % bound, in too few trials to settle,"
        if end.get("how") == "too few trials" else "undecided")
    ntr = len(end.get("trials") or [])
    trials = f" in {ntr} trials" if ntr > 1 else ""
    return f"{name} {end['load']:g} {unit} {verdict} at {end.get('requests', 0)} requests{trials} ({'; '.join(parts)})"


@dataclass
class CapacityRun:
    run_dir: Path
    status: str
    result: dict[str, Any]
    line: str
    message: str = ""


def run_capacity(server: Server, wl: Workload, run_dir: Path, spec: SearchSpec, targets: Targets, *,
                 shape: TrialShape | None = None, study: str, config_id: str, record: dict[str, Any],
                 budget_s: float | None = None, resume: bool = False, progress: bool = False,
                 log: Callable[[str], None] | None = None, metrics_interval_s: float | None = None,
                 gpu_devices: list[int] | None = None,
                 before_final: Callable[[dict[str, Any]], None] | None = None) -> CapacityRun:
    """Search the highest load meeting `targets`; every trial an ordinary level in `run_dir`.
    Raises FileExistsError when the folder has records and `resume` is off."""
    shape = shape or TrialShape()
    log = log or progress_line
    rf, rs = open_run_folder(run_dir, resume)
    wl1 = trial_workload(wl, spec, shape, spec.snap(spec.start))
    counter = server_counter(server, wl1, warn=log)
    sources = make_sources(server, wl1, warn=log, counter=counter)
    _start_record(record, rf.run if rs else {}, server, wl, wl1.buckets[0].label, sources, spec, shape, targets,
                  budget_s)
    rf.write_run(record)
    mi = wl.metrics_interval_s if metrics_interval_s is None else metrics_interval_s
    seq = rs.next_seq if rs else 0
    t0 = time.monotonic()
    status, message = "complete", ""
    trials = trials_in(rf.path, spec.axis) if rs else []
    walls: list[float] = []
    try:
        while True:
            st = state(trials, targets, spec)
            if st.done:
                break
            # the next trial costs what the slowest so far took (an overloaded server drains long)
            nominal = max([trial_nominal_s(spec, shape), *walls])
            if budget_s is not None and time.monotonic() - t0 + nominal > budget_s:
                status, message = "partial", (f"time budget {budget_s:.0f} s reached after {len(trials)} trials: "
                                              "best result so far (continue with --resume)")
                break
            li, wlt, lv = _next_trial(trials, st.next_load, wl, spec, shape)
            lr = LevelRunner(server, wlt, rf, study=study, config_id=config_id, sources=sources, progress=progress,
                             metrics_interval_s=mi, log=log, gpu_devices=gpu_devices, counter=counter,
                             only=(li, lv), first_seq=seq)
            ramped = f", workers started over {wlt.concurrency_ramp_s:.1f} s" if wlt.concurrency_ramp_s else ""
            log(f"{config_id}: trial {li + 1} at {st.next_load:g} ({st.reason}{ramped})")
            t_trial = time.monotonic()
            _, tstatus, tmsg = run_sync(lr.run())
            walls.append(time.monotonic() - t_trial)
            seq = lr.seq
            if tstatus != "complete" and not lr.stopped_early:  # a failure budget spent is a failing trial
                status, message = "partial", tmsg
                break
            trials = trials_in(rf.path, spec.axis)
    except KeyboardInterrupt:
        status, message = "partial", "interrupted by the user (Ctrl-C)"
        raise
    finally:
        res, line = _finish(rf, record, trials, targets, spec, status, message, before_final)
    return CapacityRun(rf.path, status, res, line, message)


def _start_record(record: dict[str, Any], prev: dict[str, Any], server: Server, wl: Workload, bucket: str,
                  sources: dict[str, Any], spec: SearchSpec, shape: TrialShape, targets: Targets,
                  budget_s: float | None) -> None:
    """The run record before the first trial: the search's settings, and what a resumed run keeps."""
    if prev:
        record["started_at"] = prev.get("started_at", record.get("started_at"))
        record["resumed"] = [*prev.get("resumed", []), {"previous_status": prev.get("status")}]
        for k in ("prediction",):
            if k in prev:
                record[k] = prev[k]  # a prediction stays the one stored before the first trial
    record.update({"server": server.info, "model_name": server.model, "workload": wl.model_dump(),
                   "calibration": {k: v.calibration() for k, v in sources.items()},
                   "capacity": {"spec": asdict(spec), "shape": asdict(shape), "targets": targets.terms(),
                                "bucket": bucket, "budget_s": budget_s,
                                "worst_case": worst_case(spec, shape)},
                   "status": "running"})


def _next_trial(trials: list[Trial], load: float, wl: Workload, spec: SearchSpec,
                shape: TrialShape) -> tuple[int, Workload, Level]:
    """The next trial's level index, workload and level at `load`."""
    li = max([tr.level for tr in trials], default=-1) + 1
    ramp = ramp_for(trials, load, wl.buckets[shape.bucket].output_tokens)  # closed loop only
    wlt = trial_workload(wl, spec, shape, load, first=li == 0, ramp_s=ramp)
    lv = Level(wlt.buckets[0], wlt.max_in_flight if spec.axis == "rate" else int(load),
               load if spec.axis == "rate" else 0.0)
    return li, wlt, lv


def _finish(rf: RunFolder, record: dict[str, Any], trials: list[Trial], targets: Targets, spec: SearchSpec, status: str,
            message: str, before_final: Callable[[dict[str, Any]], None] | None) -> tuple[Any, str]:
    """The search's result and line into the record, which is finalized; returns them."""
    st = state(trials, targets, spec)
    res = result(st, targets, spec)
    line = capacity_line(res) if trials else "capacity at SLO: no trial finished"
    record["capacity"].update(result=res, line=line)
    if before_final:
        before_final(record)
    finalize(rf, record, status=status, message=message)
    return res, line


def from_params(p: Any, buckets: list[Any] | None = None) -> tuple[SearchSpec, TrialShape]:
    """A study's `capacity:` block (schema.CapacityParams) as the search spec and trial shape."""
    labels = [b.label for b in buckets or []]
    if p.bucket is not None and p.bucket not in labels:
        raise ValueError(f"capacity.bucket {p.bucket!r} is not a workload bucket; have {labels}")
    spec = SearchSpec(axis=p.axis, start=p.start, min_load=p.min_load, max_load=p.max_load, growth=p.growth,
                      precision=p.precision, repeats=p.repeats, max_repeats=p.max_repeats, max_trials=p.max_trials)
    shape = TrialShape(duration_s=p.duration_s, warmup_rounds=p.warmup_rounds, rounds=p.rounds,
                       requests_per_round=p.requests_per_round, ramp=p.ramp,
                       bucket=labels.index(p.bucket) if p.bucket is not None else 0)
    return spec, shape


def run_capacity_study(server: Server, wl: Workload, run_dir: Path, params: Any, slo: Any, **kw: Any) -> Any:
    """`run_capacity` for a study's configuration (its `capacity:` block and the study's `slo:`),
    answered as the runner's RunResult (the capacity line as its message)."""
    spec, shape = from_params(params, wl.buckets)
    kw.setdefault("budget_s", params.budget_s)
    out = run_capacity(server, wl, run_dir, spec, Targets.of(slo), shape=shape, **kw)
    rf = RunFolder(out.run_dir)
    return RunResult(out.run_dir, out.status, len(rf.records), rf.summary,
                     "; ".join(x for x in (out.line, out.message) if x))


def study_worst_case_lines(study: Any) -> list[str]:
    """The dry run's lines for configurations that search their capacity (none without one)."""
    out = []
    for c in study.configurations:
        p = study.capacity_for(c.id)
        if p is None:
            continue
        spec, shape = from_params(p, study.workload_for(c.id).buckets)
        budget = f"; stops at its budget of {p.budget_s:.0f} s" if p.budget_s else ""
        out.append(f"[{c.id}] capacity search at the SLO: {worst_case_line(worst_case(spec, shape))}{budget}")
    return out
