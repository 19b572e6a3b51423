"""What else used the machine while a round was measured: the idle engines of an interleaved run
(their process trees), every other process (the machine's busy CPU time from /proc/stat minus the
client's and the engines' own), and the hypervisor (steal time). A round during which other
processes took a quarter of a core or more is disturbed whatever its numbers say; `wait_quiet`
holds a re-measurement back until they stop. Linux only; elsewhere the machine-wide figures are
absent and only the statistical rule (`measure.outliers`) flags a round. Not for deciding what to
re-measure (`measure.interleave`)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

FOREIGN_CPU = 0.25  # cores: other processes (or steal) at least this busy over a round disturb it
PROC_STAT = Path("/proc/stat")
SLACK_TICKS = 3  # the clock ticks a difference of CPU times may be off by (each reading rounds down)


def _ticks() -> float:
    return float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0


def machine_cpu() -> tuple[float, float] | None:
    """(busy, steal) CPU seconds of the whole machine since boot (/proc/stat's first line: user,
    nice, system, irq and softirq are busy; guest time is inside user); None where unreadable."""
    try:
        f = PROC_STAT.read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    v = [float(x) for x in f[1:]] + [0.0] * 10
    hz = _ticks()
    return (v[0] + v[1] + v[2] + v[5] + v[6]) / hz, v[7] / hz


def _tree(pid: int) -> list[psutil.Process]:
    with contextlib.suppress(psutil.Error):
        p = psutil.Process(pid)
        return [p, *p.children(recursive=True)]
    return []


def _cpu(procs: list[psutil.Process]) -> float:
    total = 0.0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            total += t.user + t.system
    return total


class MachineMeter:
    """Around each round: the other engines' CPU (`neighbour_cpu_frac_*`, fractions of a core), and
    the cores every process outside the client and the engines used (`foreign_cpu`) and the
    hypervisor stole (`steal_cpu`), with the round's wall-clock window (`t0_unix`, `t1_unix`)."""

    def __init__(self, pids: Mapping[str, int], *, servers_known: bool = True) -> None:
        """`pids`: each engine's process; `servers_known` False when a server measured here has no
        known process (an attached server, a test's stand-in): its CPU would read as another
        process's, so `foreign_cpu` is not measured (steal still is)."""
        self.procs = {sid: _tree(pid) for sid, pid in pids.items()}
        self.procs = {k: v for k, v in self.procs.items() if v}
        self.servers_known = servers_known

    def own(self) -> float:
        """CPU seconds of the client (this process and its workers) and every engine's tree."""
        return _cpu(_tree(os.getpid())) + sum(_cpu(p) for p in self.procs.values())

    def around(self, measured: str) -> "MachineMeter.Round":
        return MachineMeter.Round(self, [s for s in self.procs if s != measured])

    def window(self) -> "MachineMeter.Round":
        """A window with no engine measured (`wait_quiet`)."""
        return MachineMeter.Round(self, [])

    @dataclass
    class Round:
        meter: "MachineMeter"
        others: list[str]
        t0: float = 0.0
        t0_unix: float = 0.0
        cpu0: dict[str, float] = field(default_factory=dict)
        machine0: tuple[float, float] | None = None
        own0: float = 0.0

        def start(self) -> None:
            self.cpu0 = {s: _cpu(self.meter.procs[s]) for s in self.others}
            self.machine0, self.own0 = machine_cpu(), self.meter.own()
            self.t0, self.t0_unix = time.perf_counter(), time.time()

        def stop(self) -> dict[str, Any]:
            wall = time.perf_counter() - self.t0
            if wall <= 0:
                return {}
            out: dict[str, Any] = {"t0_unix": round(self.t0_unix, 3), "t1_unix": round(self.t0_unix + wall, 3)}
            m1 = machine_cpu()
            if self.machine0 is not None and m1 is not None:
                if self.meter.servers_known:
                    used = m1[0] - self.machine0[0]
                    # CPU times count in clock ticks (10 ms): a short round's figure is a lower bound
                    out["foreign_cpu"] = round(max(0.0, used - (self.meter.own() - self.own0) - SLACK_TICKS / _ticks())
                                               / wall, 3)
                out["steal_cpu"] = round(max(0.0, m1[1] - self.machine0[1] - SLACK_TICKS / _ticks()) / wall, 3)
            if self.others:
                fr = [(_cpu(self.meter.procs[s]) - self.cpu0[s]) / wall for s in self.others]
                out.update(neighbours=len(fr), neighbour_cpu_frac_max=max(fr), neighbour_cpu_frac_sum=sum(fr))
            return out


def busy(stats: Mapping[str, Any]) -> float:
    """Cores taken from the measurement by other processes and the hypervisor (0 when not measured)."""
    return float(stats.get("foreign_cpu") or 0.0) + float(stats.get("steal_cpu") or 0.0)


async def wait_quiet(meter: MachineMeter, *, most_s: float, step_s: float = 1.0) -> tuple[float, float]:
    """Wait, one `step_s` window at a time, until other processes and steal use less than
    `FOREIGN_CPU` cores or `most_s` has passed. Returns (seconds waited, cores busy in the last window)."""
    t0, last = time.monotonic(), 0.0
    while True:
        w = meter.window()
        w.start()
        await asyncio.sleep(step_s)
        last = busy(w.stop())
        if last < FOREIGN_CPU or time.monotonic() - t0 + step_s > most_s:
            return time.monotonic() - t0, last


__all__ = ["FOREIGN_CPU", "MachineMeter", "busy", "machine_cpu", "wait_quiet"]
