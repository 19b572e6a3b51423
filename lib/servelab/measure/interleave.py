"""Several engines measured interleaved: one round of one level at a time, alternating the order
(A B C D, D C B A, ...), so drift of the machine cancels between the configurations compared
instead of landing in one of them, and sequential sampling within a time budget.

Every engine is an ordinary `LevelRunner` writing its own run folder (records, client stats,
levels, samples): the files are those of a one-at-a-time run, with rounds numbered alike (the
same round of a level sends the same prompts to every engine). Levels run in the grid's order;
within a level, after the workload's `rounds` measured rounds, `decide` (given every start's
rounds so far) names the starts that still need rounds, and one more round goes to those, until
it names none, `max_rounds` is reached or the level's share of the budget is spent. The engines
that wait meanwhile are sampled for their CPU use around every round (`neighbour_cpu_frac_*` in
client_stats.jsonl): idle engines must not disturb the measured one. Not for the statistics
(`analysis.verdicts`, handed in as `decide`) nor for starting engines (`hosts`).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import psutil

from ..summary import round_throughput
from .rounds import PoolLost
from .runner import STOP_SIGNALS, LevelRunner, RunAborted

#: decide(level index, rounds so far: summary.round_throughput rows with `config` = start id) ->
#: (the starts that need another round, a short note for the progress line)
Decide = Callable[[int, pd.DataFrame], tuple[set[str], str]]
MIN_ROUNDS = 3  # rounds a level gets even past its budget share: at 2 an A/A pair's interval rests on one
#                residual degree of freedom (a fresh clone on a slow day got 2 at every level, 2026-12-03)


class NeighbourMeter:
    """CPU share of the other engines' process trees while one engine is measured."""

    def __init__(self, pids: Mapping[str, int]) -> None:
        self.procs: dict[str, list[psutil.Process]] = {}
        for sid, pid in pids.items():
            with contextlib.suppress(psutil.Error):
                p = psutil.Process(pid)
                self.procs[sid] = [p, *p.children(recursive=True)]
        self.others: list[str] = []

    def _cpu(self, sid: str) -> float:
        total = 0.0
        for p in self.procs.get(sid, []):
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                total += t.user + t.system
        return total

    def around(self, measured: str) -> "NeighbourMeter._Round":
        return NeighbourMeter._Round(self, [s for s in self.procs if s != measured])

    @dataclass
    class _Round:
        meter: "NeighbourMeter"
        others: list[str]
        t0: float = 0.0
        cpu0: dict[str, float] = field(default_factory=dict)

        def start(self) -> None:
            self.cpu0 = {s: self.meter._cpu(s) for s in self.others}  # noqa: SLF001 (its own meter)
            self.t0 = time.perf_counter()

        def stop(self) -> dict[str, Any]:
            wall = time.perf_counter() - self.t0
            if not self.others or wall <= 0:
                return {}
            fr = [(self.meter._cpu(s) - self.cpu0[s]) / wall for s in self.others]  # noqa: SLF001
            return {"neighbours": len(fr), "neighbour_cpu_frac_max": max(fr), "neighbour_cpu_frac_sum": sum(fr)}


@dataclass
class LevelSampling:
    """How one level's sampling went: measured rounds per start, why it stopped, its time."""

    label: str
    rounds: dict[str, int]
    stopped: str  # "settled" | "max_rounds" | "budget" | "fixed"
    seconds: float
    note: str = ""


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
        self.meter = NeighbourMeter(pids or {})
        self.log = log or first.log
        self.sampling: list[LevelSampling] = []
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

    async def _round(self, states: dict[str, Any], starts: Sequence[str], rnd: int,
                     rounds: dict[str, list[dict[str, Any]]]) -> None:
        order = list(starts) if rnd % 2 == 0 else list(reversed(starts))  # A B C, C B A, ...
        for sid in order:
            r = self.runners[sid]
            _pause(r, False)
            try:
                recs = await r.level_round(states[sid], rnd, meter=self.meter.around(sid))
            finally:
                _pause(r, True)
            rounds[sid].extend(recs)

    def _rounds_table(self, rounds: Mapping[str, list[dict[str, Any]]]) -> pd.DataFrame:
        recs = [r for x in rounds.values() for r in x]
        return round_throughput(pd.DataFrame(recs)) if recs else pd.DataFrame()

    async def _level(self, li: int, levels_left: int) -> None:
        wl, t0 = self.wl, time.monotonic()
        starts = list(self.runners)
        lv = self.grid[li]
        states = {sid: await r.level_begin(li, lv) for sid, r in self.runners.items()}
        rounds: dict[str, list[dict[str, Any]]] = {sid: [] for sid in starts}
        for rnd in range(wl.warmup_rounds):
            await self._round(states, starts, rnd, {sid: [] for sid in starts})
        rnd = wl.warmup_rounds
        share = (self.deadline - time.monotonic()) / max(levels_left, 1) if self.deadline else None
        level_end = time.monotonic() + share if share is not None else None
        stopped, note = "fixed", ""
        for i in range(wl.rounds):
            if self.decide is not None and i >= MIN_ROUNDS and level_end is not None and time.monotonic() > level_end:
                stopped = "budget"  # a slow machine: the first rounds alone would overrun the budget
                break
            await self._round(states, starts, rnd, rounds)
            rnd += 1
        if self.decide is not None and stopped != "budget":
            while True:
                need, note = self.decide(li, self._rounds_table(rounds))
                need_order = [s for s in starts if s in need]
                if not need_order:
                    stopped = "settled"
                    break
                if rnd - wl.warmup_rounds >= self.max_rounds:
                    stopped = "max_rounds"
                    break
                per_round = _round_seconds(rounds, need_order)
                if level_end is not None and time.monotonic() + per_round > level_end:
                    stopped = "budget"
                    break
                await self._round(states, need_order, rnd, rounds)
                rnd += 1
                left = f", budget left {self.deadline - time.monotonic():.0f} s" if self.deadline else ""
                self.log(f"interleaved {lv.label}: round {rnd - wl.warmup_rounds} for {len(need_order)} of "
                         f"{len(starts)} starts ({note}){left}")
        n = {sid: len({r['round'] for r in rounds[sid]}) for sid in starts}
        for sid, r in self.runners.items():
            await r.level_end(states[sid], sampling={"stopped": stopped, "measured_rounds": n[sid]})
        self.sampling.append(LevelSampling(lv.label, n, stopped, time.monotonic() - t0, note))


def _pause(runner: LevelRunner, paused: bool) -> None:
    for s in runner.samplers:
        if hasattr(s, "pause"):
            s.pause(paused)


def _round_seconds(rounds: Mapping[str, list[dict[str, Any]]], starts: Sequence[str]) -> float:
    """Expected wall time of one more round over `starts`: each one's mean round time so far."""
    total = 0.0
    for sid in starts:
        recs = rounds.get(sid) or []
        by_round: dict[int, list[dict[str, Any]]] = {}
        for r in recs:
            by_round.setdefault(r["round"], []).append(r)
        walls = [max(x["end_s"] for x in g) - min(x["start_s"] for x in g) for g in by_round.values()]
        total += sum(walls) / len(walls) if walls else 0.0
    return total


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
                    log: Callable[[str], None] | None = None) -> tuple[dict[str, Any], list[LevelSampling]]:
    """Prepare every start's run folder (`runner.prepare_run`), send the grid interleaved
    (`Interleaved`), and close each run.json (`runner.finish_run`), also on Ctrl-C. Returns
    ({start id: RunResult}, the sampling of each level)."""
    from .rounds import run_sync
    from .runner import finish_run, prepare_run

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
        results = {sid: finish_run(p, status if p.runner.status == "complete" else p.runner.status,
                                   message or p.runner.message.strip())
                   for sid, p in prepared.items()}
    return results, il.sampling
