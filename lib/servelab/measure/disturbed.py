"""Disturbed rounds while measuring: every attempt of every round of one level of an interleaved
run, judged after each pass, and which of them to measure again.

An attempt is `ok`, `suspect` (far slower than its start's other rounds: `measure.outliers.suspect`;
it is measured again, and counts as disturbed only when the new attempt is not as slow), `disturbed`
(other processes or the hypervisor took `machine.FOREIGN_CPU` cores more than they do all along while it ran, or a
suspect whose new attempt was faster), or `reproduced` (a suspect whose new attempt was as slow:
what its prompt does, kept with the new attempt beside it). Disturbed attempts stay in the run
folder (their records carry `disturbed`, their level line lists them) and are left out of every
result; a suspect that could not be measured again within the budget stays in. Not for sending
(`measure.interleave`) nor for the rule's thresholds (`measure.outliers`, `measure.machine`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..schema.runfiles import RequestRecord
from ..summary import decode_tps_steady, round_wave
from . import outliers
from .machine import FOREIGN_CPU, busy

OK, SUSPECT, DISTURBED, REPRODUCED = "ok", "suspect", "disturbed", "reproduced"
MAX_ATTEMPTS = 3  # a round is measured at most three times: once, and again twice


@dataclass
class Attempt:
    """One start's round, once: its records and what else used the machine meanwhile."""

    sid: str
    rnd: int
    attempt: int
    records: list[RequestRecord]
    stats: dict[str, Any] = field(default_factory=dict)
    status: str = OK
    reason: str = ""
    by_machine: bool = False  # disturbed because other processes or the hypervisor took the CPU meanwhile

    def value(self, metric: str) -> float:
        """The log of a judged per-round metric (`measure.outliers.JUDGED`); NaN when the round
        has none (every request failed)."""
        ok = [r for r in self.records if r.ok]
        if not ok:
            return math.nan
        if metric == "decode_tps_steady":
            v = decode_tps_steady(ok, round_wave(ok[0].concurrency, ok[0].rate_rps))
        else:
            wall = self.wall_s
            v = sum(r.output_tokens or 0 for r in ok) / wall if wall > 0 else math.nan
        return math.log(v) if v > 0 else math.nan

    @property
    def wall_s(self) -> float:
        return (max(r.end_s for r in self.records) - min(r.start_s for r in self.records)) if self.records else 0.0


class Disturbances:
    """The attempts of one level, in the order they ran."""

    def __init__(self, background: float = 0.0) -> None:
        """`background`: the cores other processes use all along (`Interleaved`: a low quantile of the
        run's rounds so far); a round is disturbed when they take `FOREIGN_CPU` more than that, so a
        machine shared throughout (another test worker in CI) is not re-measured round after round."""
        self.attempts: list[Attempt] = []
        self.background = background

    def add(self, a: Attempt) -> Attempt:
        self.attempts.append(a)
        return a

    def of(self, sid: str, rnd: int) -> list[Attempt]:
        return [a for a in self.attempts if a.sid == sid and a.rnd == rnd]

    def judge(self) -> None:
        """Mark what the machine and the statistics say of every attempt not judged yet."""
        for a in self.attempts:
            if a.status == OK and busy(a.stats) >= self.background + FOREIGN_CPU:
                a.status, a.reason, a.by_machine = DISTURBED, _machine_reason(a.stats), True
        for sid in dict.fromkeys(a.sid for a in self.attempts):
            mine = [a for a in self.attempts if a.sid == sid and a.status in (OK, REPRODUCED)]
            for metric, direction in outliers.JUDGED.items():
                y = np.array([a.value(metric) for a in mine])
                for a, flag, v in zip(mine, outliers.suspect(y, direction), y):
                    if flag and a.status == OK:
                        best = np.nanmax(y) if direction > 0 else np.nanmin(y)
                        a.status = SUSPECT
                        a.reason = f"{math.exp(abs(best - v)):.1f}x slower than its best round ({_NAMES[metric]})"

    def to_measure(self) -> list[tuple[str, int]]:
        """(start, round) pairs whose last attempt is suspect or disturbed and that may be measured again."""
        out = []
        for sid, rnd in dict.fromkeys((a.sid, a.rnd) for a in self.attempts):
            tries = self.of(sid, rnd)
            if tries[-1].status in (SUSPECT, DISTURBED) and len(tries) < MAX_ATTEMPTS:
                out.append((sid, rnd))
        return out

    def settle(self, new: Attempt) -> None:
        """After `new` measured a round again: a suspect before it is disturbed when `new` is faster
        beyond the rule's margin on a judged metric, else both are what the round does (reproduced)."""
        tries = self.of(new.sid, new.rnd)
        prev = tries[-2] if len(tries) >= 2 else None
        if prev is None or prev.status != SUSPECT:
            return
        same = all(outliers.reproduced(prev.value(m), new.value(m), d) for m, d in outliers.JUDGED.items()
                   if math.isfinite(prev.value(m)) and math.isfinite(new.value(m)))
        if same:
            prev.status = new.status = REPRODUCED
        else:
            prev.status = DISTURBED
            prev.reason += "; measured again it was not"

    def busy_now(self) -> bool:
        """Whether the machine was busy with other processes during the last attempt."""
        return bool(self.attempts) and busy(self.attempts[-1].stats) >= self.background + FOREIGN_CPU

    def kept(self, sid: str) -> list[dict[str, Any]]:
        """The records of a start's attempts that results are computed from (all but disturbed)."""
        return [r for a in self.attempts if a.sid == sid and a.status != DISTURBED for r in a.records]

    def rounds(self, sid: str) -> int:
        """Rounds of a start with at least one attempt kept."""
        return len({a.rnd for a in self.attempts if a.sid == sid and a.status != DISTURBED})

    def disturbed(self, sid: str | None = None) -> list[Attempt]:
        return [a for a in self.attempts if a.status == DISTURBED and (sid is None or a.sid == sid)]

    def remeasured(self, sid: str | None = None) -> int:
        return sum(1 for a in self.attempts if a.attempt > 0 and (sid is None or a.sid == sid))

    def lines(self, sid: str) -> list[dict[str, Any]]:
        """levels.jsonl's `disturbed` of a start: each disturbed attempt, why, when and how busy."""
        return [{"round": a.rnd, "attempt": a.attempt, "reason": a.reason,
                 **{k: a.stats[k] for k in ("t0_unix", "t1_unix", "foreign_cpu", "steal_cpu") if k in a.stats}}
                for a in self.disturbed(sid)]

    def marks(self, sid: str, level: int) -> dict[tuple[int, int, int], str]:
        """(level, round, attempt) -> reason of a start's disturbed attempts (`runfolder.mark_records`)."""
        return {(level, a.rnd, a.attempt): a.reason for a in self.disturbed(sid)}


_NAMES = {"decode_tps_steady": "decode tok/s", "aggregate_output_tps": "aggregate tok/s"}


def _machine_reason(stats: dict[str, Any]) -> str:
    steal = float(stats.get("steal_cpu") or 0.0)
    text = f"other processes used {float(stats.get('foreign_cpu') or 0.0):.2f} cores"
    return text + (f", the hypervisor stole {steal:.2f}" if steal >= 0.05 else "")


__all__ = ["Attempt", "DISTURBED", "Disturbances", "MAX_ATTEMPTS", "OK", "REPRODUCED", "SUSPECT"]
