"""Several engines measured interleaved: one round of one level at a time, alternating the order
(A B C D, D C B A, ...), so drift of the machine cancels between the configurations compared
instead of landing in one of them, and sequential sampling within a time budget.

Every engine is an ordinary `LevelRunner` writing its own run folder (records, client stats,
levels, samples): the files are those of a one-at-a-time run, with rounds numbered alike (the
same round of a level sends the same prompts to every engine). Levels run in the grid's order;
within a level, after the workload's `rounds` measured rounds, `decide` (given every start's
rounds so far) names the starts that still need rounds, and one more round goes to those, until
it names none, `max_rounds` is reached or the level's share of the budget is spent. Past its share a
level goes on only for comparisons still above the rule's aim (`decide` asked with finer=False), for at
most `BORROW` of its share more, taken from the levels after it (each lends at most `LEND` of its own;
the last level takes it from the re-measuring reserve, at most `LAST_LEND` of it):
the level whose rounds cost most (rewrite at c=4: 3 rounds in every run, the worst MDE on noisy days)
is not left above the aim while a cheap one settled early. The workload's warm-up rounds run first at
every level, unmeasured, for every start.

Around every round the machine is metered (`measure.machine`): the waiting engines' CPU
(`neighbour_cpu_frac_*` in client_stats.jsonl: idle engines must not disturb the measured one),
other processes' CPU and the hypervisor's steal. After every pass the level's rounds are judged
(`measure.disturbed`): a round that other processes disturbed, or that is far slower than its
start's other rounds and not as slow when measured again, is measured again once the machine is
quiet, out of a reserve of the budget (`RESERVE`); the wait for quiet moves the deadline (up to
`WAIT_CREDIT_S` over the run: the run takes longer, the later levels keep their rounds); the disturbed
attempt stays in the run folder, flagged, and out of every result. Not for the statistics (`analysis.verdicts`, handed in as
`decide`) nor for starting engines (`hosts`).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from ..schema.runfiles import SampledLevel
from ..runfolder import RECORDS, mark_records
from ..summary import round_throughput
from .disturbed import Attempt, Disturbances
from .machine import MachineMeter, busy, wait_quiet
from .rounds import PoolLost, run_sync
from .runner import STOP_SIGNALS, LevelRunner, RunAborted, finish_run, prepare_run

#: decide(level index, rounds so far: summary.round_throughput rows with `config` = start id, whether the
#: rule's finer aim may ask for rounds (False past the level's share)) -> (the starts that need another
#: round, a short note for the progress line)
Decide = Callable[[int, pd.DataFrame, bool], tuple[set[str], str]]
MIN_ROUNDS = 3  # rounds a level gets even past its budget share: at 2 an A/A pair's interval rests on one
#                residual degree of freedom (a fresh clone on a slow day got 2 at every level, 2026-12-03)
RESERVE = 0.15  # share of the sampling time kept for measuring disturbed rounds again
BORROW = 0.5  # past its share, a level with comparisons above the aim may use this much of its share more ...
LEND = 0.25  # ... and each level after it lends at most this much of its own
LAST_LEND = 0.5  # the last level borrows at most this much of the re-measuring reserve
QUIET_WAIT_S = 45.0  # the longest wait for other processes to stop before a round is measured again
WAIT_CREDIT_S = 30.0  # waiting for quiet up to this much over the run does not count against the budget: the
#                       run takes that much longer instead of the levels after the disturbance losing their rounds
#                       (two busy processes for 60 s: 48 s of waiting left the last level 3 rounds and an MDE of
#                       10.8 % in a 9:11 `make report`, 2026-12-05; more credit would pass 10 minutes)


class Interleaved:
    """Runs the grid of several starts (one `LevelRunner` each, same grid) interleaved.

    `deadline` (time.monotonic() seconds) bounds the sampling: each level may use the time left
    divided by the levels left; `max_rounds` caps a level's measured rounds; `decide` None means a
    fixed design (the workload's rounds, interleaved)."""

    def __init__(self, runners: Mapping[str, LevelRunner], *, decide: Decide | None = None,
                 deadline: float | None = None, max_rounds: int | None = None, pids: Mapping[str, int] | None = None,
                 log: Callable[[str], None] | None = None) -> None:
        self.runners = dict(runners)
        first = next(iter(self.runners.values()))
        labels = [[lv.label for lv in r.grid] for r in self.runners.values()]
        if any(x != labels[0] for x in labels):
            raise ValueError("interleaved starts must share one grid of levels")
        self.grid, self.wl = first.grid, first.wl
        self.decide, self.deadline = decide, deadline
        self.max_rounds = max_rounds or self.wl.rounds
        self.meter = MachineMeter(pids or {}, servers_known=bool(pids) and set(pids) >= set(self.runners))
        self.log = log or first.log
        self.sampling: list[SampledLevel] = []
        self.marks: dict[str, dict[tuple[int, int, int], str]] = {}  # start -> its disturbed attempts
        self.busy_seen: list[float] = []  # other processes' cores during every round so far
        # the levels' sampling ends before the deadline: the rest is kept for re-measuring
        self.sampling_deadline = (deadline - RESERVE * max(0.0, deadline - time.monotonic())
                                  if deadline is not None else None)
        self.credit_s = 0.0  # waiting for quiet added to the deadline so far (at most WAIT_CREDIT_S)
        self.status, self.message = "complete", ""

    def _on_signal(self, sig: signal.Signals) -> None:
        for r in self.runners.values():
            r.on_signal(sig)

    async def run(self) -> tuple[str, str]:
        """(status, message) of the whole interleaved benchmark: "complete", or "partial" with the
        reason (a stop signal, a server that stopped answering); every finished record is kept."""
        loop = asyncio.get_running_loop()
        installed = False
        with contextlib.suppress(RuntimeError, ValueError, NotImplementedError):  # not the main thread (Jupyter)
            for sig in STOP_SIGNALS:
                loop.add_signal_handler(sig, self._on_signal, sig)
            installed = True
        previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
        try:
            async with contextlib.AsyncExitStack() as stack:
                for r in self.runners.values():
                    await stack.enter_async_context(r.session())
                    _pause(r, True)  # an engine is sampled only while it is measured
                await self._quiet_window()
                try:
                    for i, (li, _) in enumerate(next(iter(self.runners.values())).plan):
                        await self._level(li, levels_left=len(self.grid) - i)
                except (RunAborted, PoolLost) as e:
                    self.status, self.message = "partial", str(e)
            for r in self.runners.values():
                if r.status != "complete" and self.status == "complete":
                    self.status, self.message = r.status, r.message.strip()
            return self.status, self.message
        finally:
            if installed:
                for sig in STOP_SIGNALS:
                    loop.remove_signal_handler(sig)
                    if previous.get(sig) is not None:
                        signal.signal(sig, previous[sig])

    async def _send(self, states: dict[str, Any], sid: str, rnd: int, dist: Disturbances, attempt: int = 0) -> Attempt:
        r = self.runners[sid]
        meter = self.meter.around(sid)
        _pause(r, False)
        try:
            recs = await r.level_round(states[sid], rnd, meter=meter, attempt=attempt)
        finally:
            _pause(r, True)
        a = dist.add(Attempt(sid, rnd, attempt, recs, getattr(meter, "result", {})))
        if "foreign_cpu" in a.stats or "steal_cpu" in a.stats:
            self.busy_seen.append(busy(a.stats))
            dist.background = self._background()
        return a

    async def _round(self, states: dict[str, Any], starts: Sequence[str], rnd: int, dist: Disturbances) -> None:
        order = list(starts) if rnd % 2 == 0 else list(reversed(starts))  # A B C, C B A, ...
        for sid in order:
            await self._send(states, sid, rnd, dist)

    async def _again(self, states: dict[str, Any], dist: Disturbances, lv_label: str, log: SampledLevel) -> None:
        """Judge the level's attempts (`Disturbances.judge`) and measure its suspect and disturbed
        rounds again, once the machine is quiet, while the budget (its reserve included) allows."""
        t0 = time.monotonic()
        while True:
            dist.judge()
            todo = dist.to_measure()
            if not todo:
                break
            if dist.busy_now() and self.deadline is not None:  # without a budget: measured again at once
                room = self.deadline - time.monotonic()
                waited, load = await wait_quiet(self.meter, most_s=max(0.0, min(QUIET_WAIT_S, room - 5.0)))
                log.waited_s += waited
                credit = max(0.0, min(waited, WAIT_CREDIT_S - self.credit_s))
                if credit > 0 and self.sampling_deadline is not None:
                    self.credit_s += credit
                    log.credited_s += credit
                    self.deadline += credit
                    self.sampling_deadline += credit
                self.log(f"interleaved {lv_label}: other processes busy; waited {waited:.0f} s "
                         f"(last second: {load:.2f} cores)")
            for sid, rnd in todo:
                tries = dist.of(sid, rnd)
                # without a budget, measuring again may take at most half as long as the level so far
                spent, level = time.monotonic() - t0, t0 - self._level_t0
                if self.deadline is None and spent > 0.5 * level:
                    log.remeasure_s += spent
                    return
                if self.deadline is not None and time.monotonic() + max(a.wall_s for a in tries) > self.deadline:
                    log.remeasure_s += time.monotonic() - t0
                    return
                self.log(f"interleaved {lv_label}: {sid} round {rnd - self.wl.warmup_rounds + 1} again "
                         f"({tries[-1].status}: {tries[-1].reason})")
                dist.settle(await self._send(states, sid, rnd, dist, attempt=len(tries)))
        log.remeasure_s += time.monotonic() - t0

    async def _quiet_window(self, seconds: float = 1.0) -> None:
        """What other processes use before the first round: the first reading of the background."""
        w = self.meter.window()
        w.start()
        await asyncio.sleep(seconds)
        r = w.stop()
        if "foreign_cpu" in r or "steal_cpu" in r:
            self.busy_seen.append(busy(r))

    def _background(self) -> float:
        """Cores other processes use all along: the lower quartile over the run's rounds so far and a
        window before the first (0 where the machine-wide figures are not measured)."""
        vals = sorted(self.busy_seen)
        return vals[len(vals) // 4] if vals else 0.0

    def _rounds_table(self, dist: Disturbances) -> pd.DataFrame:
        recs = [r for sid in self.runners for r in dist.kept(sid)]
        return round_throughput(pd.DataFrame([r.line() for r in recs])) if recs else pd.DataFrame()

    def _share(self, levels_left: int) -> tuple[float | None, float | None]:
        """(when this level's share of the sampling budget ends, how far past it the level may borrow):
        the time left divided by the levels left; the levels after it lend, the last level borrows from
        the re-measuring reserve instead. (None, None) without a budget."""
        end = self.sampling_deadline
        if end is None or self.deadline is None:
            return None, None
        share = (end - time.monotonic()) / max(levels_left, 1)
        level_end = time.monotonic() + share
        lendable = LEND * share * (levels_left - 1) if levels_left > 1 else LAST_LEND * (self.deadline - end)
        return level_end, level_end + min(BORROW * share, lendable)

    def _past(self, at: float | None, credit0: float, extra: float = 0.0) -> bool:
        """Whether `extra` seconds from now end past `at`, moved by the waiting credited since `credit0`."""
        return at is not None and time.monotonic() + extra > at + (self.credit_s - credit0)

    async def _level(self, li: int, levels_left: int) -> None:
        wl, t0 = self.wl, time.monotonic()
        self._level_t0 = t0
        starts = list(self.runners)
        lv = self.grid[li]
        states = {sid: await r.level_begin(li, lv) for sid, r in self.runners.items()}
        dist = Disturbances(self._background())
        log = SampledLevel(label=lv.label)
        for rnd in range(wl.warmup_rounds):  # unmeasured, right before the level's measured rounds
            await self._round(states, starts, rnd, Disturbances())
        log.warmup_s = time.monotonic() - t0
        rnd = wl.warmup_rounds
        level_end, borrow_end = self._share(levels_left)
        credit0 = self.credit_s
        note = ""
        for i in range(wl.rounds):
            if self.decide is not None and i >= MIN_ROUNDS and self._past(level_end, credit0):
                log.stopped = "budget"  # a slow machine: the first rounds alone would overrun the budget
                break
            await self._round(states, starts, rnd, dist)
            await self._again(states, dist, lv.label, log)
            rnd += 1
        if self.decide is not None and log.stopped != "budget":
            note = await self._sample(li, states, dist, log, rnd, (level_end, borrow_end, credit0))
        await self._close_level(li, states, dist, log)
        log.seconds, log.note = time.monotonic() - t0, note
        self.sampling.append(log)

    async def _sample(self, li: int, states: dict[str, Any], dist: Disturbances, log: SampledLevel, rnd: int,
                      ends: tuple[float | None, float | None, float]) -> str:
        """The level's rounds after its first: to the starts `decide` names, within the level's share (then
        on borrowed time for comparisons above the aim); sets `log.stopped`, returns the last note."""
        assert self.decide is not None
        wl, starts, label = self.wl, list(self.runners), self.grid[li].label
        level_end, borrow_end, credit0 = ends
        while True:
            table = self._rounds_table(dist)
            need, note = self.decide(li, table, True)
            need_order = [s for s in starts if s in need]
            if not need_order:
                log.stopped = "settled"
                return note
            if rnd - wl.warmup_rounds >= self.max_rounds:
                log.stopped = "max_rounds"
                return note
            per_round = sum(_mean_wall(dist, s) for s in need_order)
            borrowing = self._past(level_end, credit0, per_round)
            if borrowing:  # past the share: only comparisons above the aim, on borrowed time
                need, note = self.decide(li, table, False)
                need_order = [s for s in starts if s in need]
                per_round = sum(_mean_wall(dist, s) for s in need_order)
                if not need_order or borrow_end is None or self._past(borrow_end, credit0, per_round):
                    log.stopped = "budget"
                    return note
            t_round = time.monotonic()
            await self._round(states, need_order, rnd, dist)
            if borrowing:
                log.borrowed_s += time.monotonic() - t_round
            await self._again(states, dist, label, log)
            rnd += 1
            left = f", budget left {self.deadline - time.monotonic():.0f} s" if self.deadline else ""
            lent = " (past the level's share)" if borrowing else ""
            self.log(f"interleaved {label}: round {rnd - wl.warmup_rounds} for {len(need_order)} of "
                     f"{len(starts)} starts{lent} ({note}){left}")

    async def _close_level(self, li: int, states: dict[str, Any], dist: Disturbances, log: SampledLevel) -> None:
        """Every start's level line (its sampling, its disturbed and re-measured rounds) and the level's log."""
        log.rounds = {sid: dist.rounds(sid) for sid in self.runners}
        for sid, r in self.runners.items():
            await r.level_end(states[sid], sampling={"stopped": log.stopped, "measured_rounds": log.rounds[sid]},
                              **({"disturbed": dist.lines(sid)} if dist.disturbed(sid) else {}),
                              **({"remeasured": dist.remeasured(sid)} if dist.remeasured(sid) else {}))
            self.marks.setdefault(sid, {}).update(dist.marks(sid, li))
        log.disturbed, log.remeasured = len(dist.disturbed()), dist.remeasured()
        log.windows = _windows(dist)
        if log.disturbed:
            self.log(f"interleaved {log.label}: {log.disturbed} disturbed rounds left out, {log.remeasured} "
                     f"measured again ({log.remeasure_s:.0f} s, {log.waited_s:.0f} s of it waiting for quiet)")


def _mean_wall(dist: Disturbances, sid: str) -> float:
    walls = [a.wall_s for a in dist.attempts if a.sid == sid]
    return sum(walls) / len(walls) if walls else 0.0


def _windows(dist: Disturbances, gap_s: float = 5.0) -> list[dict[str, Any]]:
    """The disturbed attempts of a level as time windows (attempts less than `gap_s` apart join one):
    from, to (unix seconds), how many rounds of how many starts, the most cores other processes took,
    and how many of the rounds other processes or the hypervisor disturbed (`machine_rounds`; the
    others were far slower than their start's other rounds and not as slow measured again)."""
    out: list[dict[str, Any]] = []
    for a in sorted(dist.disturbed(), key=lambda a: a.stats.get("t0_unix", 0.0)):
        t0, t1 = a.stats.get("t0_unix"), a.stats.get("t1_unix")
        if t0 is None or t1 is None:
            continue
        b, m = busy(a.stats), int(a.by_machine)
        if out and t0 - out[-1]["to"] <= gap_s:
            w = out[-1]
            w["to"], w["rounds"], w["busy_cpu"] = max(w["to"], t1), w["rounds"] + 1, max(w["busy_cpu"], b)
            w["starts"], w["machine_rounds"] = sorted({*w["starts"], a.sid}), w["machine_rounds"] + m
        else:
            out.append({"from": t0, "to": t1, "rounds": 1, "starts": [a.sid], "busy_cpu": b, "machine_rounds": m})
    return out


def _pause(runner: LevelRunner, paused: bool) -> None:
    for s in runner.samplers:
        if hasattr(s, "pause"):
            s.pause(paused)


@dataclass
class Start:
    """One engine of an interleaved run: where to send, where to write, the run.json record."""

    id: str
    server: Any
    run_dir: Any
    record: dict[str, Any]
    pid: int | None = None
    before_final: Callable[[dict[str, Any]], None] | None = None


def run_interleaved(starts: Sequence[Start], wl: Any, *, study: str, decide: Decide | None = None,
                    deadline: float | None = None, max_rounds: int | None = None, progress: bool = False,
                    log: Callable[[str], None] | None = None) -> tuple[dict[str, Any], list[SampledLevel]]:
    """Prepare every start's run folder (`runner.prepare_run`), send the grid interleaved
    (`Interleaved`), and close each run.json (`runner.finish_run`), also on Ctrl-C. Returns
    ({start id: RunResult}, the sampling of each level)."""
    prepared = {s.id: prepare_run(s.server, wl, s.run_dir, study=study, config_id=s.id, record=s.record,
                                  progress=progress, log=log, before_final=s.before_final) for s in starts}
    il = Interleaved({sid: p.runner for sid, p in prepared.items()}, decide=decide, deadline=deadline,
                     max_rounds=max_rounds, pids={s.id: s.pid for s in starts if s.pid}, log=log)
    status, message = "failed", ""
    try:
        status, message = run_sync(il.run())
    except KeyboardInterrupt:
        status, message = "partial", "interrupted by the user (Ctrl-C)"
        raise
    finally:
        for sid, p in prepared.items():  # the disturbed attempts' records say so (nothing is deleted)
            mark_records(p.rf / RECORDS, il.marks.get(sid, {}))
        results = {sid: finish_run(p, status if p.runner.status == "complete" else p.runner.status,
                                   message or p.runner.message.strip())
                   for sid, p in prepared.items()}
    return results, il.sampling
